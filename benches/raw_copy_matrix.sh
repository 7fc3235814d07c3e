#!/usr/bin/env bash
# Raw-copy limit against the synthetic source over partitions x batch size x codec.
# Each cell starts a fresh source, runs kmirror-raw-copy for $SECS seconds (or $MAX_GB GB),
# prints its report line, deletes the output files and stops the source.
#
#   SECS=5 MODE=file benches/raw_copy_matrix.sh        # write responses to files (default)
#   SECS=5 MODE=discard benches/raw_copy_matrix.sh     # network only, bytes dropped
#   PARTS="1 16" BATCHES=16384 CODECS=lz4 benches/raw_copy_matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-5}
MAX_GB=${MAX_GB:-3}
MODE=${MODE:-file}
PARTS=${PARTS:-"1 16 256"}
BATCHES=${BATCHES:-"16384 1048576"}
CODECS=${CODECS:-"lz4 zstd"}
BIN=target/release
[[ -x $BIN/kmirror-synth-source && -x $BIN/kmirror-raw-copy ]] || {
    echo "build first: cargo build --release --bin kmirror-synth-source --bin kmirror-raw-copy" >&2
    exit 1
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kmirror-rawcopy.XXXXXX")
src_pid=""
cleanup() {
    [[ -n $src_pid ]] && kill "$src_pid" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) mode=$MODE secs=$SECS"
for codec in $CODECS; do
    for batch in $BATCHES; do
        for parts in $PARTS; do
            data=(--codec "$codec" --batch-bytes "$batch" --partitions "$parts")
            "$BIN/kmirror-synth-source" --listen 127.0.0.1:0 "${data[@]}" >"$WORK/source.out" 2>"$WORK/source.err" &
            src_pid=$!
            for _ in $(seq 1 600); do
                grep -q '^listening on' "$WORK/source.out" 2>/dev/null && break
                kill -0 "$src_pid" 2>/dev/null || { cat "$WORK/source.err" >&2; exit 1; }
                sleep 0.1
            done
            read -r _ _ addr layout <"$WORK/source.out"
            out=()
            if [[ $MODE == file ]]; then
                mkdir -p "$WORK/out"
                out=(--out-dir "$WORK/out")
            fi
            load=$(cut -d' ' -f1 /proc/loadavg)
            report=$("$BIN/kmirror-raw-copy" --bootstrap "$addr" "${data[@]}" "${out[@]}" \
                --seconds "$SECS" --max-gb "$MAX_GB")
            echo "codec=$codec batch_target=$batch partitions=$parts $layout load1=$load $report"
            rm -rf "$WORK/out"
            kill "$src_pid"
            wait "$src_pid" 2>/dev/null || true
            src_pid=""
        done
    done
done
