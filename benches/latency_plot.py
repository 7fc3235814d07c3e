#!/usr/bin/env python3
"""Percentile plot (SVG) of one latency from an HdrHistogram interval log.

Reads the log kmirror's telemetry writes (V2 compressed histograms, base64, one line per
interval and tag `<latency>.shard<N>`), merges the intervals whose tag starts with --tag, and
draws latency (ms) against percentile on the usual HdrHistogram axis (log of 1 / (1 - q): 90%,
99%, 99.9%, ...). Also prints the percentiles it plotted, so they can be checked against
`kmirror latency FILE`. Python's standard library only.
"""
import argparse
import base64
import math
import struct
import sys
import zlib

V2_COOKIE = 0x1C849303
V2_COMPRESSED_COOKIE = 0x1C849304


def read_varint_zigzag(buf, pos):
    """HdrHistogram's LEB128 variant: up to 9 bytes, the 9th carrying 8 bits; then ZigZag."""
    value = 0
    for i in range(9):
        b = buf[pos]
        pos += 1
        if i == 8:
            value |= b << 56
            break
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            break
    return (value >> 1) ^ -(value & 1), pos


def decode(encoded):
    """One V2 (compressed) histogram -> (counts by index, sub_bucket_half_count_magnitude,
    unit_magnitude)."""
    raw = base64.b64decode(encoded)
    cookie, length = struct.unpack(">ii", raw[:8])
    # Encoders set word-size bits in the cookie (the Rust crate writes 0x1c849313/0x1c849314).
    if cookie & ~0xF0 == V2_COMPRESSED_COOKIE:
        raw = zlib.decompress(raw[8 : 8 + length])
        cookie = struct.unpack(">i", raw[:4])[0]
    if cookie & ~0xF0 != V2_COOKIE:
        raise ValueError(f"not a V2 histogram (cookie {cookie:#x})")
    payload_len, _norm, digits, lowest, _highest = struct.unpack(">iiiqq", raw[4:32])
    pos, end = 40, 40 + payload_len
    counts = {}
    index = 0
    while pos < end:
        v, pos = read_varint_zigzag(raw, pos)
        if v < 0:
            index += -v
        else:
            if v:
                counts[index] = counts.get(index, 0) + v
            index += 1
    largest = 2 * 10**digits
    sub_bucket_count = 1 << math.ceil(math.log2(largest))
    half_mag = int(math.log2(sub_bucket_count)) - 1
    unit_mag = int(math.floor(math.log2(lowest)))
    return counts, half_mag, unit_mag


def value_of(index, half_mag, unit_mag):
    """Highest value equivalent to counts index `index` (what value_at_quantile reports)."""
    half = 1 << half_mag
    bucket = (index >> half_mag) - 1
    sub = (index & (half - 1)) + half
    if bucket < 0:
        sub -= half
        bucket = 0
    low = sub << (bucket + unit_mag)
    size = 1 << (bucket + unit_mag)
    return low + size - 1


def merged_values(path, tag):
    values = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#") or line.startswith('"'):
            continue
        parts = line.split(",")
        t = None
        if parts[0].startswith("Tag="):
            t = parts[0][4:]
            parts = parts[1:]
        if len(parts) != 4 or (t or "").split(".shard")[0] != tag:
            continue
        counts, half_mag, unit_mag = decode(parts[3])
        for i, c in counts.items():
            v = value_of(i, half_mag, unit_mag)
            values[v] = values.get(v, 0) + c
    return sorted(values.items())


def percentile_curve(values):
    total = sum(c for _, c in values)
    pts, seen = [], 0
    for v, c in values:
        seen += c
        pts.append((seen / total, v))
    return total, pts


def value_at(pts, q):
    for cq, v in pts:
        if cq >= q:
            return v
    return pts[-1][1]


def svg(pts, title, path):
    w, h, l, r, t, b = 900, 520, 80, 30, 50, 70
    max_x = 6.0  # up to 99.9999%
    x_of = lambda q: l + (w - l - r) * min(max_x, -math.log10(max(1 - q, 10**-max_x))) / max_x
    max_ms = max(v for _, v in pts) / 1e6
    top = 10 ** math.ceil(math.log10(max_ms)) if max_ms > 0 else 1
    for m in (0.2, 0.5):
        if max_ms <= top * m:
            top *= m
            break
    y_of = lambda ms: t + (h - t - b) * (1 - ms / top)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="14">{title}</text>',
    ]
    for k in range(int(max_x) + 1):
        x = l + (w - l - r) * k / max_x
        label = "0%" if k == 0 else f"{100 - 10 ** (2 - k):g}%"
        out.append(f'<line x1="{x:.1f}" y1="{t}" x2="{x:.1f}" y2="{h - b}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{h - b + 18}" text-anchor="middle">{label}</text>')
    for k in range(6):
        ms = top * k / 5
        y = y_of(ms)
        out.append(f'<line x1="{l}" y1="{y:.1f}" x2="{w - r}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{l - 8}" y="{y + 4:.1f}" text-anchor="end">{ms:g}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">percentile</text>')
    out.append(f'<text x="20" y="{h / 2}" transform="rotate(-90 20 {h / 2})" text-anchor="middle">latency (ms)</text>')
    # Step curve: each recorded value holds from the quantile before it to its own.
    d, prev_q = [], 0.0
    for q, v in pts:
        ms = v / 1e6
        d.append(f"{x_of(prev_q):.1f},{y_of(ms):.1f} {x_of(min(q, 1 - 10**-max_x)):.1f},{y_of(ms):.1f}")
        prev_q = q
        if q >= 1 - 10**-max_x:
            break
    out.append(f'<polyline fill="none" stroke="#1f5fbf" stroke-width="2" points="{" ".join(d)}"/>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("svg")
    ap.add_argument("--tag", default="end_to_end")
    ap.add_argument("--title", default="latency")
    a = ap.parse_args()
    values = merged_values(a.log, a.tag)
    if not values:
        sys.exit(f"{a.log}: no samples tagged {a.tag}")
    total, pts = percentile_curve(values)
    row = " ".join(f"p{p:g}={value_at(pts, p / 100) / 1e6:.3f}" for p in (50, 90, 99, 99.9, 99.99, 100))
    print(f"{a.tag}: count={total} ms: {row}")
    svg(pts, a.title, a.svg)


if __name__ == "__main__":
    main()
