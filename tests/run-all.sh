#!/usr/bin/env bash
# Runs every test: unit, property and integration tests (the latter start a real Kafka broker).
# tests/setup.sh first brings what the tests need (Debian packages, the Python clients in .venv,
# the Kafka jars), so this passes on a machine that has only the toolchains.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
cargo test --all-targets --no-fail-fast
