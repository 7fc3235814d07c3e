#!/usr/bin/env python3
"""Waits until a mirror's log dir holds every record of a source broker's log dir.

Both dirs are Kafka log dirs (a broker's or kmirror's: same format). For each partition the
end offset is lastOffset + 1 of the last complete batch, read by walking batch headers only
(baseOffset, length, lastOffsetDelta), incrementally from where the previous poll stopped, so a
poll costs microseconds and never disturbs what is measured. Counting records rather than bytes
matters for MirrorMaker 2, which re-batches and recompresses: its bytes differ from the source's.

Prints key=value: the target's bytes and records, seconds from the watcher's start (launch of
the mirror) to the first mirrored record and to the last, and each watched pid's CPU ticks
(user+system, /proc/PID/stat) at start, first record and done.
"""
import argparse
import os
import struct
import sys
import time


class PartitionWalker:
    def __init__(self, path):
        self.path = path
        self.segment = None
        self.pos = 0
        self.end = 0  # next offset after the last complete batch seen

    def poll(self):
        try:
            logs = sorted(f for f in os.listdir(self.path) if f.endswith(".log"))
        except FileNotFoundError:
            return self.end
        if not logs:
            return self.end
        # Earlier segments are complete once a newer one exists; only the newest grows.
        newest = logs[-1]
        if newest != self.segment:
            self.segment, self.pos = newest, 0
        with open(os.path.join(self.path, newest), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while self.pos + 27 <= size:
                f.seek(self.pos)
                head = f.read(27)
                if len(head) < 27:
                    break
                base, length = struct.unpack(">qi", head[:12])
                if length <= 0 or self.pos + 12 + length > size:
                    break
                delta = struct.unpack(">i", head[23:27])[0]
                self.end = max(self.end, base + delta + 1)
                self.pos += 12 + length
        return self.end

    def bytes(self):
        try:
            return sum(
                os.path.getsize(os.path.join(self.path, f))
                for f in os.listdir(self.path)
                if f.endswith(".log")
            )
        except FileNotFoundError:
            return 0


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--target-dir", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--pids", default="", help="name=pid,...; the first is the mirror process")
    ap.add_argument("--poll", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    start = time.monotonic()
    pids = [p.split("=") for p in a.pids.split(",") if p]
    cpu = {name: [cpu_ticks(pid)] for name, pid in pids}
    names = [f"{a.topic}-{p}" for p in range(a.partitions)]
    sources = [PartitionWalker(os.path.join(a.source_dir, n)) for n in names]
    want = [w.poll() for w in sources]
    total = sum(want)
    walkers = [PartitionWalker(os.path.join(a.target_dir, n)) for n in names]
    first = None
    status = "ok"
    while True:
        got = [w.poll() for w in walkers]
        now = time.monotonic()
        if first is None and sum(got) > 0:
            first = now - start
            for name, pid in pids:
                cpu[name].append(cpu_ticks(pid))
        if all(g >= w for g, w in zip(got, want)):
            break
        if now - start > a.timeout:
            status = "timeout"
            break
        # The first watched pid is the mirror: if it died, waiting longer is pointless.
        if pids and not os.path.exists(f"/proc/{pids[0][1]}"):
            status = "mirror-exited"
            break
        time.sleep(a.poll)
    done = time.monotonic() - start
    if first is None:
        first = done
        for name, pid in pids:
            cpu[name].append(cpu_ticks(pid))
    for name, pid in pids:
        cpu[name].append(cpu_ticks(pid))
    out = [
        f"status={status}",
        f"source_records={total}",
        f"source_bytes={sum(w.bytes() for w in sources)}",
        f"target_records={sum(got)}",
        f"target_bytes={sum(w.bytes() for w in walkers)}",
        f"first_s={first:.2f}",
        f"done_s={done:.2f}",
    ]
    for name, ticks in cpu.items():
        out.append(f"{name}_ticks={'/'.join(str(t) for t in ticks)}")
    print(" ".join(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
