#!/usr/bin/env bash
# Medians per cell of mirror_matrix.sh output (REPEAT > 1): reads its lines on stdin (or the
# files named) and prints one Markdown row per cell with the number of runs and the median of
# kmirror MB/s, raw MB/s, MB/s ratio and CPU ratio. Skipped and failed runs are left out.
#   REPEAT=3 benches/mirror_matrix.sh | tee matrix.log | benches/matrix_summary.sh
set -euo pipefail
awk '
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
/^codec=/ && / ratio=/ {
    delete f
    for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    # Lines from before the groups knob have no groups= field: kmirror then had one.
    if (!("groups" in f)) f["groups"] = 1
    # Nor a log_writes= field before that knob: the writes were then ring WRITEs.
    if (!("log_writes" in f)) f["log_writes"] = "io_worker"
    # Nor a catch_up= field before the catch-up split: kmirror then never split.
    if (!("catch_up" in f)) f["catch_up"] = 0
    key = f["codec"] " | " f["batch"] " | " f["partitions"] " | " f["shards"] " | " f["sessions"] " | " f["groups"] " | " f["catch_up"] " | " f["log_writes"]
    if (!(key in runs)) order[++cells] = key
    runs[key]++
    mb[key] = mb[key] " " f["MBps"]; raw[key] = raw[key] " " f["raw_MBps"]
    ratio[key] = ratio[key] " " f["ratio"]; cpu[key] = cpu[key] " " f["cpu_ratio"]
}
END {
    print "| codec | batch B | partitions | shards | sessions | groups | catch-up | log writes | runs | kmirror MB/s | raw MB/s | MB/s ratio | CPU ratio |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (c = 1; c <= cells; c++) {
        k = order[c]
        printf "| %s | %d | %.1f | %.1f | %.2f | %.2f |\n", k, runs[k], median(mb[k]), median(raw[k]), median(ratio[k]), median(cpu[k])
    }
}' "$@"
