#!/usr/bin/env bash
# Copies the Apache Kafka jars named in tests/kafka/pom.xml into the cache folder the test harness
# reads (KMIRROR_KAFKA_LIBS, default ~/.cache/kmirror/kafka-<version>/libs). Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
dest="${KMIRROR_KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$version/libs}"
if [ -f "$dest/.complete" ]; then
  echo "Kafka $version jars already in $dest"
  exit 0
fi
mkdir -p "$dest"
mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dest"
touch "$dest/.complete"
echo "Kafka $version jars copied to $dest ($(ls "$dest" | wc -l) files)"
