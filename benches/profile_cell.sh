#!/usr/bin/env bash
# An on-CPU profile of one mirror_matrix.sh cell (kmirror half only), per thread, with whole
# user stacks: where the shard's time goes, what the source costs, and how much of the box
# sat idle while they took turns (benches/RESULTS.md, session 24).
#
#   benches/profile_cell.sh                         # 16 partitions, 16 KiB lz4, 1 shard, 3 GB
#   PARTS=4096 SHARDS=2 benches/profile_cell.sh     # any mirror_matrix.sh cell variables
#   TOP=60 benches/profile_cell.sh                  # more symbols per table
#
# Builds kmirror with frame pointers into target/fp (its own target dir: target/release stays
# as it is), runs the cell once under `perf record -a --call-graph fp -F $FREQ`, and prints:
#   - the cell's mirror_matrix.sh line;
#   - per thread, its samples within the shard threads' active window and its share of a core,
#     and the idle share of all cores (`swapper`);
#   - for the shard threads together: the top symbols by self samples and by inclusive
#     samples (a symbol counted once per sample however often it is on the stack).
# Needs perf and python3, and root (or kernel.perf_event_paranoid <= -1) for -a. On a VM
# without hardware counters perf falls back to the cpu-clock software event, which is enough:
# these are on-CPU samples. Warm the host first as benches/README.md says. Not for CI.
set -euo pipefail
cd "$(dirname "$0")/.."
FREQ=${FREQ:-1999}
TOP=${TOP:-30}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PARTS=${PARTS:-16} BATCHES=${BATCHES:-16384} CODECS=${CODECS:-lz4} SHARDS=${SHARDS:-1}
export TOTAL_MB=${TOTAL_MB:-3000} MAX_CELL_MB=${MAX_CELL_MB:-3100} RAW=0 REPEAT=1
for tool in perf python3; do
    command -v "$tool" >/dev/null || { echo "profile_cell.sh needs $tool" >&2; exit 1; }
done
CARGO_TARGET_DIR=target/fp RUSTFLAGS="-C force-frame-pointers=yes" \
    cargo build --release --bins --quiet
perf record -q -F "$FREQ" -a --call-graph fp -o "$OUT/perf.data" -- \
    env BIN=target/fp/release benches/mirror_matrix.sh 2>&1 | grep -v '^#' || true
perf script -i "$OUT/perf.data" -F comm,tid,time,ip,sym >"$OUT/perf.txt" 2>"$OUT/perf-script.err"
python3 - "$OUT/perf.txt" "$TOP" "$FREQ" <<'EOF'
import collections, re, sys

path, top, freq = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
samples = []  # (comm, tid, time, [symbols, leaf first])
cur = None
with open(path, errors="replace") as f:
    for line in f:
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
        elif not line[0].isspace():
            # "comm tid time:" (comm may hold spaces; tid and time are the last two fields)
            head = line.split()
            cur = (" ".join(head[:-2]), head[-2], float(head[-1].rstrip(":")), [])
        elif cur:
            parts = line.strip().split(None, 1)
            sym = parts[1] if len(parts) > 1 else "?"
            sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
            sym = re.sub(r"::h[0-9a-f]{16}", "", sym)
            cur[3].append(sym)
if cur:
    samples.append(cur)
shard = [s for s in samples if s[0].startswith("kmirror-shard")]
if not shard:
    sys.exit("no samples from a kmirror-shard thread: did the cell run?")
t0, t1 = min(s[2] for s in shard), max(s[2] for s in shard)
window = [s for s in samples if t0 <= s[2] <= t1]
per_core = (t1 - t0) * freq
cores = sum(1 for line in open("/proc/cpuinfo") if line.startswith("processor"))
print(f"shard window {t1 - t0:.2f} s, {len(window)} samples on {cores} cores")
print("\n| thread | samples | share of a core |\n|---|---|---|")
by_thread = collections.Counter((s[0], s[1]) for s in window)
for (comm, tid), n in [t for t in by_thread.most_common() if t[0][0] != "swapper"][:12]:
    print(f"| {comm} {tid} | {n} | {100 * n / per_core:.0f} % |")
idle = sum(n for (comm, _), n in by_thread.items() if comm == "swapper")
print(f"\nidle: {100 * idle / (per_core * cores):.0f} % of all cores")
n = len(shard)
self_ = collections.Counter(s[3][0] for s in shard if s[3])
incl = collections.Counter(sym for s in shard for sym in set(s[3]))
print(f"\nshard threads, {n} samples: self")
for sym, c in self_.most_common(top):
    print(f"{100 * c / n:5.1f} % {sym[:120]}")
print(f"\nshard threads: inclusive")
for sym, c in incl.most_common(top):
    print(f"{100 * c / n:5.1f} % {sym[:120]}")
EOF
echo "perf data: $OUT/perf.data"
