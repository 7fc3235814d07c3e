#!/usr/bin/env python3
"""How fast this box's filesystem creates partition directories, without kmirror.

A first start of N partitions creates, per partition, a directory and four files (the
partition.metadata tmp file, the first segment's .log, .index and .timeindex). This makes the
same directories and files under DIR (default /tmp) with THREADS threads and prints the time,
so a slow or varying start can be told apart from kmirror's own work (RESULTS.md, session 14).

Usage: benches/fs_create_rate.py [PARTITIONS=10000] [THREADS=4] [DIR=/tmp]
"""
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

FILES = (
    "partition.metadata.tmp",
    "00000000000000000000.log",
    "00000000000000000000.index",
    "00000000000000000000.timeindex",
)


def main():
    partitions = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    parent = sys.argv[3] if len(sys.argv) > 3 else "/tmp"
    root = tempfile.mkdtemp(prefix="kmirror-fs-create-", dir=parent)

    def one(i):
        d = os.path.join(root, f"t-{i}")
        os.mkdir(d)
        for name in FILES:
            os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_RDWR, 0o644))

    try:
        began = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(partitions)))
        took = time.monotonic() - began
        inodes = partitions * (1 + len(FILES))
        print(
            f"partitions={partitions} threads={threads} seconds={took:.1f} "
            f"inodes_per_s={inodes / took:.0f}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
