#!/usr/bin/env python3
"""Upstream Mooncake's Transfer Engine (PyPI wheel mooncake-transfer-engine-non-cuda, in the
venv made by tests/interop/setup_upstream_venv.sh) in a metadata-store mode, driven over
stdin/stdout with the line protocol of store_peer.cc, so that tests/store_engine can put it
beside our engine on one store.

    upstream_store_peer.py serve --metadata <conn> --name <segment name> [--size N] [--seed S]
        initialize(<name>, <conn>, "tcp", ""), registers N bytes (default 4 MiB) filled with
        pattern(seed S, default 7), prints
            READY <name> <buffer addr> <size> <rpc port> <rpc ip:port>
        (or "FAIL <reason>" and exits 1), then serves one command per line:
            PING                          -> PONG
            CHECK <off> <len> <seed>      -> OK | BAD <offset> | ERR <reason>
            FILL <off> <len> <seed>       -> OK | ERR <reason>
            PUT <segment> <off> <len> <seed>
                fills local [off, off+len) and writes it to the segment's first buffer at the
                same offset (get_first_buffer_address, batch_transfer_sync_write)
            GET <segment> <off> <len> <seed>
                reads the same range into a zeroed local range and checks every byte
            QUIT                          -> destroys the engine (upstream removes its keys), BYE
        EOF on stdin is QUIT.

Run with MC_TCP_BIND_ADDRESS set (the address upstream publishes under rpc_meta and as
tcp_data_host). Everything the library prints goes to stderr; stdout carries protocol lines
only. pattern(seed)[i] = (i * 131 + seed) & 0xff, i being the offset from the buffer start.
"""

import argparse
import ctypes
import gc
import os
import sys
import threading

# stdout hygiene: protocol lines on a private dup of stdout; fd 1 (and the library) to stderr.
_PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)

BLOCK = 256 << 10


def emit(line):
    _PROTO.write(line.replace("\n", " ") + "\n")
    _PROTO.flush()


def hard_exit(code):
    try:
        _PROTO.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def pattern_bytes(start, length, seed):
    per = bytes(((i * 131 + seed) & 0xFF) for i in range(256))
    rot = start % 256
    base = per[rot:] + per[:rot]
    return (base * (length // 256 + 1))[:length]


def first_mismatch(addr, off, length, seed):
    got = ctypes.string_at(addr + off, length)
    want = pattern_bytes(off, length, seed)
    if got == want:
        return -1
    for j in range(length):
        if got[j] != want[j]:
            return off + j
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["serve"])
    ap.add_argument("--metadata", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--size", type=lambda s: int(s, 0), default=4 << 20)
    ap.add_argument("--seed", type=lambda s: int(s, 0), default=7)
    ap.add_argument("--max-lifetime", type=float, default=120.0)
    args = ap.parse_args()
    if not os.environ.get("MC_TCP_BIND_ADDRESS"):
        emit("FAIL MC_TCP_BIND_ADDRESS is not set")
        hard_exit(2)
    # Never outlive a test that forgot us.
    t = threading.Timer(args.max_lifetime, lambda: hard_exit(3))
    t.daemon = True
    t.start()

    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        emit("FAIL cannot import mooncake.engine: %s" % e)
        hard_exit(1)
    te = TransferEngine()
    rc = te.initialize(args.name, args.metadata, "tcp", "")
    if rc != 0:
        emit("FAIL initialize(%r, %r, tcp) returned %d" % (args.name, args.metadata, rc))
        hard_exit(1)
    keep = ctypes.create_string_buffer(args.size)
    addr = ctypes.addressof(keep)
    ctypes.memmove(addr, pattern_bytes(0, args.size, args.seed), args.size)
    rc = te.register_memory(addr, args.size)
    if rc != 0:
        emit("FAIL register_memory returned %d" % rc)
        hard_exit(1)
    port = te.get_rpc_port()
    emit("READY %s %d %d %d %s:%d" % (args.name, addr, args.size, port,
                                      os.environ["MC_TCP_BIND_ADDRESS"], port))

    fn = None  # a bound method keeps the engine alive: cleared before the shutdown below
    for raw in sys.stdin:
        parts = raw.split()
        if not parts:
            continue
        cmd = parts[0].upper()
        if cmd == "QUIT":
            break
        try:
            if cmd == "PING":
                emit("PONG")
            elif cmd in ("CHECK", "FILL"):
                off, ln, seed = (int(x, 0) for x in parts[1:4])
                if off < 0 or ln < 0 or off + ln > args.size:
                    emit("ERR range outside the buffer")
                elif cmd == "FILL":
                    ctypes.memmove(addr + off, pattern_bytes(off, ln, seed & 0xFF), ln)
                    emit("OK")
                else:
                    bad = first_mismatch(addr, off, ln, seed & 0xFF)
                    emit("OK" if bad < 0 else "BAD %d" % bad)
            elif cmd in ("PUT", "GET"):
                seg = parts[1]
                off, ln, seed = (int(x, 0) for x in parts[2:5])
                if off < 0 or ln <= 0 or off + ln > args.size:
                    emit("ERR bad range")
                    continue
                remote = te.get_first_buffer_address(seg)
                if not remote:
                    emit("ERR get_first_buffer_address(%s) returned 0" % seg)
                    continue
                if cmd == "PUT":
                    ctypes.memmove(addr + off, pattern_bytes(off, ln, seed & 0xFF), ln)
                else:
                    ctypes.memset(addr + off, 0, ln)
                local, remotes, lens = [], [], []
                o = off
                while o < off + ln:
                    n = min(BLOCK, off + ln - o)
                    local.append(addr + o)
                    remotes.append(remote + o)
                    lens.append(n)
                    o += n
                fn = te.batch_transfer_sync_write if cmd == "PUT" else te.batch_transfer_sync_read
                rc = fn(seg, local, remotes, lens)
                if rc != 0:
                    emit("ERR batch_transfer_sync_%s returned %d"
                         % ("write" if cmd == "PUT" else "read", rc))
                elif cmd == "GET":
                    bad = first_mismatch(addr, off, ln, seed & 0xFF)
                    emit("OK" if bad < 0 else "BAD %d" % bad)
                else:
                    emit("OK")
            else:
                emit("ERR unknown command %s" % cmd)
        except Exception as e:  # keep serving; report the problem
            emit("ERR %s" % e)

    # A clean shutdown: upstream removes rpc_meta (freeEngine) and the segment descriptor
    # (transport destructor) from the store.
    fn = None
    del te
    gc.collect()
    emit("BYE")
    hard_exit(0)


if __name__ == "__main__":
    main()
