#!/usr/bin/env bash
# Copies MirrorMaker 2 (connect-mirror 4.1.1 and what it needs) into
# ~/.cache/kmirror/mm2-<version>/libs for benches/mm2_compare.sh. Idempotent (.complete marker).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
dest="${KMIRROR_MM2_LIBS:-$HOME/.cache/kmirror/mm2-$version/libs}"
if [ -f "$dest/.complete" ]; then
  echo "MirrorMaker 2 $version jars already in $dest"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dest"
touch "$dest/.complete"
echo "MirrorMaker 2 $version jars copied to $dest ($(ls "$dest" | wc -l) files)"
