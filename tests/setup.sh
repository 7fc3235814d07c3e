#!/usr/bin/env bash
# Brings every test dependency onto a machine that has only the toolchains README names (Rust by
# rustup, Java 17 + Maven, Python 3). Called first by tests/run-all.sh; safe to run again.
#  * Debian packages: installed with apt-get when run as root; otherwise one line says exactly
#    what to install and the script fails before any test runs.
#  * Python clients: into the project virtualenv .venv (pinned in tests/python/requirements.txt).
#  * Kafka jars: through Maven (tests/kafka/fetch-jars.sh), cached in ~/.m2 and ~/.cache/kmirror.
set -euo pipefail
cd "$(dirname "$0")/.."

# rustfmt and clippy: README's contributors and CI check formatting and lints.
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || rustup component add rustfmt clippy
fi
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust with rustup" >&2; exit 1; }

# Debian packages the tests call:
#  prometheus        promtool (ops_metrics checks /metrics; ops alert rules are unit-tested)
#  systemd           systemd-analyze/-sysusers/-tmpfiles (ops_systemd checks systemd/ with them)
#  fonts-dejavu-core fonts for `kmirror latency --plot`
#  util-linux        prlimit/setpriv (ops_doctor, runtime_memlock)
#  procps            kill (the tests signal kmirror and brokers), pgrep (.ci/run's stray-JVM check)
#  strace            ops_systemd records kmirror's syscalls to check the unit's SystemCallFilter
#  openssl           PEM test certificates and keys (the admin API's and listeners' TLS)
#  python3-venv      `python3 -m venv` (Debian's python3 lacks ensurepip without it)
#  openjdk-17-jdk-headless, maven  the Kafka broker, Kafka's tools (keytool too) and the Java clients
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
command -v setpriv >/dev/null || need+=(util-linux)
# type -P: the binary Command::new("kill") runs, not the shell builtin.
type -P kill >/dev/null && type -P pgrep >/dev/null || need+=(procps)
command -v strace >/dev/null || need+=(strace)
command -v openssl >/dev/null || need+=(openssl)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: missing Debian packages; install them first: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
fi

# Python clients into .venv, reinstalled only when requirements.txt changes.
req=tests/python/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: Python clients into .venv ($req)"
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

bash tests/kafka/fetch-jars.sh
