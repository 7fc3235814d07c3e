#!/usr/bin/env bash
# Runs every test: unit, property and integration tests (the latter start a real Kafka broker).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/kafka/fetch-jars.sh
cargo test --all-targets --no-fail-fast
