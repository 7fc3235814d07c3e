#!/usr/bin/env bash
# kmirror serve vs the raw-copy limit against the synthetic source, cell by cell:
# partitions x batch size x codec x shards. Each cell moves the same finite data twice, each time
# from a fresh source: once with kmirror-raw-copy (responses written to a file, same fetch sizes,
# one connection per shard), once with `kmirror serve` until its .log files hold every byte.
# The data dir and the raw-copy file are deleted after each cell.
#
#   benches/mirror_matrix.sh                      # the full matrix, ~1 GB per cell
#   QUICK=1 BIN=target/debug benches/mirror_matrix.sh   # two tiny cells, to validate the script
#   PARTS="16 4096" BATCHES=16384 CODECS=lz4 SHARDS=1 TOTAL_MB=2000 benches/mirror_matrix.sh
#   REPEAT=3 PARTS="16 4096" ... benches/mirror_matrix.sh | benches/matrix_summary.sh
#                                    # three runs per cell, medians per cell
#   SESSIONS="on off" PARTS=4096 ... benches/mirror_matrix.sh   # kmirror with and without
#                                    # KIP-227 fetch sessions ([fetch.source_load] sessions)
#   GROUPS_PER_CONN=2 PARTS=16 ... benches/mirror_matrix.sh   # kmirror with two fetch groups
#                                    # (requests in flight) per connection
#   ALTERNATE=1 REPEAT=4 ... benches/mirror_matrix.sh   # even runs: kmirror first, raw copy after
#   KM_MAX_BYTES=2097152 GROUPS_PER_CONN=4 ... benches/mirror_matrix.sh   # kmirror with 2 MiB
#                                    # responses, four in flight per connection; raw copy unchanged
#   CATCH_UP=0 ... benches/mirror_matrix.sh   # kmirror without its catch-up split (one request
#                                    # in flight per connection even while behind)
#   RAW_PREALLOCATE=1 ... benches/mirror_matrix.sh   # the raw copy reserves blocks ahead too
#   LOG_WRITES="shard_when_fast io_worker" ... benches/mirror_matrix.sh   # each cell once per
#                                    # runtime.log_writes, each with its raw copy
#   SOURCE_FLAGS="--link-rtt-ms 20 --link-mb-s 1250" ... benches/mirror_matrix.sh   # both halves
#                                    # across an emulated 20 ms, 10 Gb/s link
#
# Per cell it prints one line of key=value figures:
#   raw_MBps / raw_cpu_s_per_GB      raw-copy: record-batch bytes per second (responses' framing
#                                    excluded, so both sides count the same bytes), its CPU
#   MBps, batches_per_s              kmirror: .log bytes appended per second, from the source's
#                                    first response with records (`first_records_at` on its
#                                    stdout) to the last .log write (its mtime); the data dir is
#                                    walked only after the source said `all_served_at`
#   cpu_s_per_GB                     kmirror's user+system CPU (/proc/PID/stat) over that window,
#                                    from the poll before the first records
#   hwm_MiB                          kmirror's peak RSS (VmHWM), registered arena included
#   arena_MiB, KiB_per_partition     shards x slots x slot size; (VmHWM - arena) / partitions
#   ratio                            kmirror MB/s / raw-copy MB/s
#   cpu_ratio                        kmirror CPU s/GB / raw-copy CPU s/GB
#   startup_s                        serve start to the first records sent (topic resolution,
#                                    creating the partition directories), not in MBps
#   dir_walks                        walks of the data dir to sum its .log bytes (made only
#                                    once the source served everything and kmirror is quiet)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
if [[ ${QUICK:-0} == 1 ]]; then
    PARTS=${PARTS:-"1 16"} BATCHES=${BATCHES:-16384} CODECS=${CODECS:-lz4}
    SHARDS=${SHARDS:-"1 2"} TOTAL_MB=${TOTAL_MB:-40}
fi
PARTS=${PARTS:-"1 16 256 4096 16384"}
BATCHES=${BATCHES:-"16384 1048576"}
CODECS=${CODECS:-"lz4 zstd"}
SHARDS=${SHARDS:-"1 2"}
TOTAL_MB=${TOTAL_MB:-1000}       # data per cell (MB = 10^6 bytes), split over the partitions
MAX_CELL_MB=${MAX_CELL_MB:-3000} # skip cells whose whole-batch rounding needs more than this
# A cell's data dir is emptied (its .log files cut to 0 B, so their pages are dropped, not
# written back) and set aside; the files themselves are deleted at the end. Why: ext4 without a
# journal (this VM's root) skips inodes freed in the last 60-300 s when it allocates, so a cell
# creating 16,384 partitions right after the previous cell deleted its own spent 10-30 s of its
# start-up in that search, which a fresh host never pays. (Keeping the data instead made the
# next cells wait on its writeback.)
CELL_TIMEOUT=${CELL_TIMEOUT:-180}
POLL=${POLL:-0.2}
IDLE_TICKS=${IDLE_TICKS:-2} # kmirror CPU ticks (1/100 s) per poll below which it counts as quiet
MAX_BYTES=${MAX_BYTES:-8388608}          # fetch max_bytes, kmirror and raw copy alike
KM_MAX_BYTES=${KM_MAX_BYTES:-$MAX_BYTES} # kmirror's fetch.max_bytes alone (the raw copy keeps MAX_BYTES)
PARTITION_MAX=${PARTITION_MAX:-1048576}  # fetch partition_max_bytes
SLOT_BYTES=${SLOT_BYTES:-$(( (KM_MAX_BYTES > MAX_BYTES ? KM_MAX_BYTES : MAX_BYTES) + 1048576 ))}
SLOTS=${SLOTS:-8}
# Runs per cell, each a raw copy then kmirror; benches/matrix_summary.sh takes the medians.
# Single cells move by ±30 % on this 2-core VM (benches/RESULTS.md, session 9).
REPEAT=${REPEAT:-1}
RAW=${RAW:-1}                            # RAW=0 skips the raw-copy half
# RAW_PREALLOCATE=1: the raw copy reserves blocks ahead of its file's end as kmirror's active
# segments do (`--preallocate`, log::preallocate), so both halves get the same filesystem help.
RAW_PREALLOCATE=${RAW_PREALLOCATE:-0}
raw_extra=()
if [[ $RAW_PREALLOCATE == 1 ]]; then raw_extra+=(--preallocate); fi
SOURCE_FLAGS=${SOURCE_FLAGS:-}           # extra synth-source flags, e.g. "--link-rtt-ms 20 --link-mb-s 1250"
SESSIONS=${SESSIONS:-on}                 # "on off": each cell once per setting, each with its raw copy
# ALTERNATE=1: even repetitions run kmirror first and the raw copy after it, so neither half
# always meets the page cache the other just freed (on this VM freed memory goes back to the
# host, and the next half refaults it: benches/RESULTS.md, session 17).
ALTERNATE=${ALTERNATE:-0}
LOG_WRITES=${LOG_WRITES:-shard_when_fast} # kmirror's runtime.log_writes, one run per value listed
CONNS_PER_SOURCE=${CONNS_PER_SOURCE:-1}  # kmirror's fetch.connections_per_source (connections per source broker and shard)
GROUPS_PER_CONN=${GROUPS_PER_CONN:-1}    # kmirror's fetch.sessions_per_connection (requests in flight
                                         # per connection); the raw copy keeps one
CATCH_UP=${CATCH_UP:-1}                  # kmirror's fetch.catch_up_pipelining (1: a second group
                                         # while behind; 0: off)
METRICS_PORT=${METRICS_PORT:-}           # set: kmirror serves /metrics there, and the shard's
                                         # fetch, append and catch-up counters at the end of each
                                         # kmirror run go to stderr as "# M" lines
for b in kmirror kmirror-synth-source kmirror-raw-copy; do
    [[ -x $BIN/$b ]] || {
        echo "build first: cargo build --release --bin kmirror --bin kmirror-synth-source --bin kmirror-raw-copy" >&2
        exit 1
    }
done
HZ=$(getconf CLK_TCK)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-mirror-matrix.XXXXXX")
src_pid="" serve_pid=""
stop() { # pid: SIGTERM, then wait
    [[ -n $1 ]] || return 0
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    stop "$serve_pid"
    stop "$src_pid"
    rm -rf "$WORK"
}
trash_n=0
set_aside() { # data dir -> its .log files emptied, the dir moved under $WORK/trash
    find "$1" -type f -name '*.log' -exec truncate -s 0 {} +
    mkdir -p "$WORK/trash"
    mv "$1" "$WORK/trash/$trash_n"
    trash_n=$((trash_n + 1))
}
trap cleanup EXIT

start_source() { # args: data flags; sets src_pid, addr, layout
    # Removed first: the background child truncates it only once it runs, and the previous
    # source's line must not be read in the meantime.
    rm -f "$WORK/source.out"
    # shellcheck disable=SC2086 # SOURCE_FLAGS is a list of flags
    "$BIN/kmirror-synth-source" --listen 127.0.0.1:0 --announce-progress "$@" $SOURCE_FLAGS >"$WORK/source.out" 2>"$WORK/source.err" &
    src_pid=$!
    for _ in $(seq 1 600); do
        grep -q '^listening on' "$WORK/source.out" 2>/dev/null && break
        kill -0 "$src_pid" 2>/dev/null || { cat "$WORK/source.err" >&2; exit 1; }
        sleep 0.1
    done
    read -r _ _ addr layout <"$WORK/source.out"
}

cpu_ticks() { # pid -> utime+stime ticks (fields 14, 15; the name in field 2 may hold spaces)
    local s
    s=$(<"/proc/$1/stat")
    s=${s##*) }
    awk '{print $12 + $13}' <<<"$s"
}

log_bytes() { # dir -> bytes in all .log segment files
    { find "$1" -name '*.log' -printf '%s\n' 2>/dev/null || true; } | awk '{s += $1} END {printf "%.0f\n", s}'
}

kv() { # key line -> value of key=... in line
    sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"
}

raw_half() { # the raw copy of the cell from the source running now; sets raw_mbps, raw_cpu
    mkdir -p "$WORK/raw"
    raw_line=$("$BIN/kmirror-raw-copy" --bootstrap "$addr" "${data[@]}" \
        --out-dir "$WORK/raw" --connections "$shards" --seconds "$CELL_TIMEOUT" \
        --max-bytes "$MAX_BYTES" --partition-max-bytes "$PARTITION_MAX" \
        ${raw_extra[@]+"${raw_extra[@]}"})
    rm -rf "$WORK/raw"
    raw_batches=$(kv batches "$raw_line")
    raw_secs=$(kv seconds "$raw_line")
    raw_mbps=$(awk -v n="$raw_batches" -v b="$bb" -v s="$raw_secs" 'BEGIN {printf "%.1f", n * b / 1e6 / s}')
    raw_cpu=$(kv cpu_s_per_GB "$raw_line")
}

# startup_s depends on the filesystem: ext4 without a journal skips inodes freed in the last
# minutes when it allocates (see the comment on set_aside), so a start right after a mass
# deletion (this script's own cleanup, a previous run) takes 10-30 s at 16,384 partitions
# instead of 1-3 s. The header says which kind the data dir is on; `kmirror doctor` warns too.
ext4_journal() { # dir -> yes | no | n/a (not ext4, or unknown)
    local dev name
    dev=$(stat -c '%Hd:%Ld' "$1" 2>/dev/null) || { echo n/a; return; }
    name=$(basename "$(readlink -f "/sys/dev/block/$dev" 2>/dev/null)")
    [[ -r /sys/fs/ext4/$name/journal_task ]] || { echo n/a; return; }
    if [[ $(<"/sys/fs/ext4/$name/journal_task") == "<none>" ]]; then echo no; else echo yes; fi
}

echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc)$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) bin=$BIN total_mb=$TOTAL_MB max_bytes=$MAX_BYTES kmirror_max_bytes=$KM_MAX_BYTES groups_per_conn=$GROUPS_PER_CONN catch_up=$CATCH_UP conns_per_source=$CONNS_PER_SOURCE log_writes=\"$LOG_WRITES\" raw_preallocate=$RAW_PREALLOCATE partition_max_bytes=$PARTITION_MAX slots=${SLOTS}x$SLOT_BYTES ext4_journal=$(ext4_journal "$WORK")"
for codec in $CODECS; do
    for batch in $BATCHES; do
        for parts in $PARTS; do
            for shards in $SHARDS; do for sess in $SESSIONS; do for lw in $LOG_WRITES; do for rep in $(seq 1 "$REPEAT"); do
                pbytes=$((TOTAL_MB * 1000000 / parts))
                data=(--codec "$codec" --batch-bytes "$batch" --partitions "$parts" --partition-bytes "$pbytes")
                start_source "${data[@]}"
                bb=$(kv batch_bytes "$layout")
                bpp=$(kv batches_per_partition "$layout")
                expected=$((parts * bpp * bb))
                cell="codec=$codec batch=$bb partitions=$parts shards=$shards sessions=$sess groups=$GROUPS_PER_CONN catch_up=$CATCH_UP conns=$CONNS_PER_SOURCE log_writes=$lw rep=$rep batches_per_partition=$bpp total_bytes=$expected"
                if ((expected > MAX_CELL_MB * 1000000)); then
                    echo "$cell skipped: whole batches need more than MAX_CELL_MB=$MAX_CELL_MB"
                    stop "$src_pid"; src_pid=""
                    continue
                fi
                # A written partition keeps its active .log open; index files share one budget
                # for the whole process (limits::INDEX_FILES_HELD_MAX, 1,024); 256 for the rest.
                fds=$((parts + 1024 + 256))
                if (($(ulimit -Hn) != 0)) && [[ $(ulimit -Hn) != unlimited ]] && ((fds > $(ulimit -Hn))); then
                    echo "$cell skipped: needs about $fds descriptors, hard RLIMIT_NOFILE is $(ulimit -Hn)"
                    stop "$src_pid"; src_pid=""
                    continue
                fi

                raw_mbps="" raw_line="" raw_cpu="" order=kmirror-only
                if [[ $RAW == 1 ]]; then
                    order=raw-first
                    [[ $ALTERNATE == 1 ]] && ((rep % 2 == 0)) && order=kmirror-first
                fi
                if [[ $order == raw-first ]]; then
                    raw_half
                    stop "$src_pid"
                    start_source "${data[@]}"
                fi

                data_dir="$WORK/data"
                cat >"$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["$addr"]
[topics]
names = ["synth"]
[storage]
data_dir = "$data_dir"
[runtime]
shards = $shards
arena_slot_bytes = $SLOT_BYTES
arena_slots = $SLOTS
log_writes = "$lw"
[fetch]
max_bytes = $KM_MAX_BYTES
partition_max_bytes = $PARTITION_MAX
sessions_per_connection = $GROUPS_PER_CONN
connections_per_source = $CONNS_PER_SOURCE
catch_up_pipelining = $([[ $CATCH_UP == 0 ]] && echo false || echo true)
[fetch.source_load]
sessions = $([[ $sess == off ]] && echo false || echo true)
EOF
                if [[ -n $METRICS_PORT ]]; then
                    printf '[metrics]\nlisten = "127.0.0.1:%s"\n' "$METRICS_PORT" >>"$WORK/kmirror.toml"
                fi
                load=$(cut -d' ' -f1 /proc/loadavg)
                t_launch=$(date +%s.%N)
                "$BIN/kmirror" serve --config "$WORK/kmirror.toml" >"$WORK/serve.log" 2>&1 &
                serve_pid=$!
                # The window opens when the source sends its first records (it says so on
                # stdout) and closes at the last .log write. The data dir is walked only once the
                # source has served everything and kmirror has gone quiet (at most IDLE_TICKS of
                # CPU since the last poll): one walk of 16,384 partitions costs ~0.35 CPU-s, and
                # one of 4,096 about 80 ms, which during the last writes would take a core from
                # the mirror being measured. (Bytes written by kmirror, /proc/PID/io wchar, would
                # be cheaper but miss the writes that go through the ring.)
                t0="" c0="" b0=0 t1="" c1="" b1=0 c_prev="" served="" status=ok walks=0 busy_polls=0
                while :; do
                    if ! kill -0 "$serve_pid" 2>/dev/null; then status=serve-exited; break; fi
                    now=$(date +%s.%N)
                    c=$(cpu_ticks "$serve_pid" 2>/dev/null) || { status=serve-exited; break; }
                    if [[ -z $t0 ]]; then
                        t0=$(sed -n 's/^first_records_at=//p' "$WORK/source.out")
                        # CPU from the poll before the first records: start-up's last ticks count
                        # against kmirror rather than its first appends being missed.
                        [[ -n $t0 ]] && c0=${c_prev:-$c}
                    fi
                    [[ -z $served ]] && grep -q '^all_served_at=' "$WORK/source.out" && served=1
                    # Busy for 10 polls after the source served everything: walk anyway, so a
                    # mirror that never goes quiet still finishes (or times out) as before.
                    [[ -n $served ]] && busy_polls=$((busy_polls + 1))
                    ((c - ${c_prev:-0} <= IDLE_TICKS)) && busy_polls=0
                    c_prev=$c c1=$c
                    if [[ -n $served ]] && ((busy_polls % 10 == 0)); then
                        walks=$((walks + 1))
                        b1=$(log_bytes "$data_dir")
                        ((b1 >= expected)) && break
                    fi
                    if awk -v n="$now" -v l="$t_launch" -v m="$CELL_TIMEOUT" 'BEGIN {exit !(n - l > m)}'; then
                        status=timeout; break
                    fi
                    sleep "$POLL"
                done
                hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$serve_pid/status" 2>/dev/null || echo 0)
                # After the peak-memory read: rendering every partition's series for the
                # scrape takes memory of its own (megabytes at 16,384 partitions).
                if [[ -n $METRICS_PORT ]]; then
                    curl -s "127.0.0.1:$METRICS_PORT/metrics" |
                        grep -E '^kmirror_shard_(fetch|appends|catch_up|log_writes_inline)' |
                        sed 's/^/# M /' >&2 || true
                fi
                stop "$serve_pid"; serve_pid=""
                stop "$src_pid"; src_pid=""
                if [[ $status != ok ]]; then
                    b1=$(log_bytes "$data_dir")
                    echo "$cell load1=$load status=$status bytes=$b1 of $expected"
                    tail -5 "$WORK/serve.log" | sed 's/^/#   serve: /'
                    rm -rf "$data_dir"
                    continue
                fi
                # The last segment write, rather than the poll that noticed it, ends the window.
                t1=$(find "$data_dir" -name '*.log' -printf '%T@\n' | sort -n | tail -1)
                set_aside "$data_dir"
                if [[ $order == kmirror-first ]]; then
                    start_source "${data[@]}"
                    raw_half
                    stop "$src_pid"; src_pid=""
                fi
                awk -v t0="$t0" -v t1="$t1" -v tl="$t_launch" -v b0="$b0" -v b1="$b1" -v c0="$c0" -v c1="$c1" \
                    -v hz="$HZ" -v bb="$bb" -v hwm="$hwm" -v parts="$parts" -v shards="$shards" \
                    -v slots="$SLOTS" -v slot="$SLOT_BYTES" -v raw="$raw_mbps" -v rawcpu="${raw_cpu:-}" \
                    -v cell="$cell order=$order" -v load="$load" -v walks="$walks" 'BEGIN {
                        s = t1 - t0; mb = (b1 - b0) / 1e6
                        if (s <= 0) { s = 1e-9 }
                        mbps = mb / s
                        cpu = (c1 - c0) / hz
                        arena = shards * slots * slot / 1048576
                        line = sprintf("%s load1=%s MBps=%.1f batches_per_s=%.0f cpu_s_per_GB=%.3f seconds=%.2f startup_s=%.2f hwm_MiB=%.1f arena_MiB=%.0f KiB_per_partition=%.1f dir_walks=%d",
                            cell, load, mbps, (b1 - b0) / bb / s, (mb > 0 ? cpu / (mb / 1000) : 0), s, t0 - tl,
                            hwm / 1024, arena, (hwm - arena * 1024) / parts, walks)
                        if (raw != "") line = line sprintf(" raw_MBps=%s raw_cpu_s_per_GB=%s ratio=%.2f cpu_ratio=%.2f", raw, rawcpu, mbps / raw, (mb > 0 && rawcpu > 0 ? cpu / (mb / 1000) / rawcpu : 0))
                        print line
                    }'
            done; done; done; done
        done
    done
done
