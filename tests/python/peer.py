"""A target engine in its own process, for the multi-process tests.

Usage: peer.py <size> [protocol]. Registers <size> bytes, prints "ready <segment> <addr>
<size>", then answers one line per command read from stdin:
  sha256            hex digest of the buffer
  fill <byte>       set every byte, answers "ok"
  notifies          the notifies received so far, as "name=msg" separated by ";" (or "-")
EOF ends it.
"""
import ctypes
import hashlib
import sys

from mooncake.engine import TransferEngine


def main():
    size = int(sys.argv[1])
    protocol = sys.argv[2] if len(sys.argv) > 2 else "tcp"
    buf = (ctypes.c_char * size)()
    addr = ctypes.addressof(buf)
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
        sys.exit("peer: initialize failed")
    if engine.register_memory(addr, size) != 0:
        sys.exit("peer: register_memory failed")
    print(f"ready 127.0.0.1:{engine.get_rpc_port()} {addr} {size}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "sha256":
            print(hashlib.sha256(ctypes.string_at(addr, size)).hexdigest(), flush=True)
        elif cmd[0] == "fill":
            ctypes.memset(addr, int(cmd[1]), size)
            print("ok", flush=True)
        elif cmd[0] == "notifies":
            got = ";".join(f"{n.name}={n.msg}" for n in engine.get_notifies())
            print(got or "-", flush=True)
        else:
            print(f"error unknown command {cmd[0]}", flush=True)
    del engine


if __name__ == "__main__":
    main()
