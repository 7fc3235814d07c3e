"""Holds many Kafka connections open, each after one answered request, until stdin closes.

  hold_connections.py HOST:PORT COUNT

Opens COUNT TCP connections to HOST:PORT, sends ApiVersions v0 on each and reads the whole
answer, then prints {"held": COUNT} and waits for stdin to close; any connection that is refused
or closed before answering fails the run. Run it under a raised RLIMIT_NOFILE (prlimit).
"""
import json
import socket
import struct
import sys

API_VERSIONS = struct.pack(">ihhih", 10, 18, 0, 1, 0)
TIMEOUT_S = 60  # failure guard per connection on a loaded machine, not a performance claim


def read_exactly(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise RuntimeError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def main(addr, count):
    host, port = addr.rsplit(":", 1)
    held = []
    for i in range(int(count)):
        s = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        s.sendall(API_VERSIONS)
        (length,) = struct.unpack(">i", read_exactly(s, 4))
        body = read_exactly(s, length)
        if struct.unpack(">i", body[:4])[0] != 1:
            raise RuntimeError(f"connection {i}: wrong correlation id")
        held.append(s)
    print(json.dumps({"held": len(held)}), flush=True)
    sys.stdin.read()
    for s in held:
        s.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
