#!/usr/bin/env bash
# Copies the Apache Kafka jars named in tests/kafka/pom.xml (the release kmirror targets), in
# tests/kafka/legacy/*/pom.xml (older releases the harness also runs) and in
# tests/kafka/newer/*/pom.xml (newer releases, as sources and clients) into the cache folders the
# test harness reads: ~/.cache/kmirror/kafka-<version>/libs (KMIRROR_KAFKA_LIBS overrides the
# folder of the main release). Idempotent: a folder with a .complete marker is left alone.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

fetch() {
  local pom="$1" dest="$2" version="$3"
  if [ -f "$dest/.complete" ]; then
    echo "Kafka $version jars already in $dest"
    return
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$dest"
  touch "$dest/.complete"
  echo "Kafka $version jars copied to $dest ($(ls "$dest" | wc -l) files)"
}

version_of() { sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$1"; }

main_version="$(version_of "$here/pom.xml")"
fetch "$here/pom.xml" "${KMIRROR_KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$main_version/libs}" "$main_version"
for pom in "$here"/legacy/*/pom.xml "$here"/newer/*/pom.xml; do
  v="$(version_of "$pom")"
  fetch "$pom" "$HOME/.cache/kmirror/kafka-$v/libs" "$v"
done
