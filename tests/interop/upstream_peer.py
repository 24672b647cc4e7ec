#!/usr/bin/env python3
"""Driver for upstream Mooncake's Transfer Engine (PyPI wheel
mooncake-transfer-engine-non-cuda), used as the reference peer in interop tests.

Run it with the interpreter of the venv made by setup_upstream_venv.sh.

Pattern: byte i of a buffer is p(i) = (i*131 + seed) & 0xff, i = offset inside the buffer.

Roles
-----
target --size N [--seed S] [--host H] [--managed] [--max-lifetime SEC]
    Initializes a P2PHANDSHAKE/tcp engine on H (default 127.0.0.1), allocates and registers an
    N-byte buffer filled with p(i) (seed S, default 7), then prints exactly one line
        READY <segment name host:port> <buffer addr> <size>
    and serves commands from stdin, one per line, one reply line each:
        CHECK <offset> <len> <seed>  -> OK | BAD <first mismatching offset> | ERR <reason>
        FILL <offset> <len> <seed>   -> OK | ERR <reason>
        NOTIFIES                     -> NOTIFIES <json list of [name, msg]> (drains get_notifies())
        PING                         -> PONG
    EOF on stdin -> exit 0.

initiator --segment NAME [--remote-addr A] --size N --op write|read --block B [--seed S]
          [--pattern-base K] [--mode batch|single] [--batch-max M] [--timeout SEC]
    Registers a local N-byte buffer and moves [A, A+N) in blocks of B bytes. Byte j of the range
    is expected to be p(K + j) (K defaults to 0, i.e. A is the target's buffer start).
    write: local filled with the pattern, written to the remote.
    read:  remote read into a zeroed local buffer, then verified against the pattern.
    Prints `RESULT ok <bytes>` (exit 0) or `RESULT fail <reason>` (exit 1).
    If --remote-addr is omitted, the first buffer of the remote segment is used.

Everything the upstream library prints (glog, printf) goes to stderr: fd 1 is re-pointed at
stderr before the library is loaded and protocol lines are written to a private dup of the
original stdout, so stdout carries only protocol lines.
"""

import argparse
import ctypes
import json
import os
import sys
import threading
import time

# ---------------------------------------------------------------------------------------------
# stdout hygiene: keep the original stdout for protocol lines only.
_PROTO_FD = os.dup(1)
os.dup2(2, 1)
sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)  # python prints -> stderr too
_proto = os.fdopen(_PROTO_FD, "w", buffering=1)


def emit(line):
    _proto.write(line + "\n")
    _proto.flush()


def log(msg):
    sys.stderr.write("[upstream_peer %d] %s\n" % (os.getpid(), msg))
    sys.stderr.flush()


def hard_exit(code):
    try:
        _proto.flush()
        sys.stderr.flush()
    finally:
        # Skip interpreter/engine teardown: the upstream destructor is not needed and must
        # never be able to hang or crash the exit.
        os._exit(code)


# ---------------------------------------------------------------------------------------------
# pattern helpers


def _period(seed):
    return bytes(((i * 131 + seed) & 0xFF) for i in range(256))


def pattern_bytes(start, length, seed):
    """p(start) .. p(start+length-1) as bytes (period 256 since 131 is odd)."""
    if length <= 0:
        return b""
    per = _period(seed)
    rot = start % 256
    base = per[rot:] + per[:rot]
    reps = length // 256 + 1
    return (base * reps)[:length]


CHUNK = 1 << 20


def fill(addr, start, length, seed):
    """Write the pattern p(start+j) at addr+j for j in [0,length)."""
    done = 0
    while done < length:
        n = min(CHUNK, length - done)
        data = pattern_bytes(start + done, n, seed)
        ctypes.memmove(addr + done, data, n)
        done += n


def first_mismatch(addr, start, length, seed):
    """Return the index j (relative) of the first byte != p(start+j), or -1."""
    done = 0
    while done < length:
        n = min(CHUNK, length - done)
        got = ctypes.string_at(addr + done, n)
        want = pattern_bytes(start + done, n, seed)
        if got != want:
            lo, hi = 0, n  # binary-search the first differing byte
            while hi - lo > 4096:
                mid = (lo + hi) // 2
                if got[lo:mid] != want[lo:mid]:
                    hi = mid
                else:
                    lo = mid
            for j in range(lo, hi):
                if got[j] != want[j]:
                    return done + j
        done += n
    return -1


# ---------------------------------------------------------------------------------------------


def make_engine(host):
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:  # pragma: no cover - environment problem
        raise RuntimeError("cannot import mooncake.engine (%s); run setup_upstream_venv.sh" % e)
    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError("TransferEngine.initialize(%r, P2PHANDSHAKE, tcp) returned %d" % (host, rc))
    return te


class Buffer:
    """An N-byte buffer registered with the engine (ctypes by default, or the managed allocator)."""

    def __init__(self, te, size, managed):
        self.size = size
        self._keep = None
        if managed:
            self.addr = te.allocate_managed_buffer(size)
            if not self.addr:
                raise RuntimeError("allocate_managed_buffer(%d) returned 0" % size)
        else:
            self._keep = ctypes.create_string_buffer(size)
            self.addr = ctypes.addressof(self._keep)
            rc = te.register_memory(self.addr, size)
            if rc != 0:
                raise RuntimeError("register_memory(0x%x, %d) returned %d" % (self.addr, size, rc))


def parse_int(s):
    return int(s, 0)


# ---------------------------------------------------------------------------------------------
# target


def run_target(args):
    if args.size <= 0:
        log("--size must be > 0")
        return 2
    if args.max_lifetime > 0:
        t = threading.Timer(args.max_lifetime, lambda: (log("max lifetime reached"), hard_exit(3)))
        t.daemon = True
        t.start()
    te = make_engine(args.host)
    buf = Buffer(te, args.size, args.managed)
    fill(buf.addr, 0, buf.size, args.seed)
    seg = "%s:%d" % (args.host, te.get_rpc_port())
    emit("READY %s %d %d" % (seg, buf.addr, buf.size))

    for raw in sys.stdin:
        parts = raw.split()
        if not parts:
            continue
        cmd = parts[0].upper()
        try:
            if cmd in ("CHECK", "FILL"):
                if len(parts) != 4:
                    emit("ERR usage: %s <offset> <len> <seed>" % cmd)
                    continue
                off, ln, seed = (parse_int(x) for x in parts[1:])
                if off < 0 or ln < 0 or off + ln > buf.size:
                    emit("ERR range [%d,%d) outside buffer of %d bytes" % (off, off + ln, buf.size))
                    continue
                if cmd == "FILL":
                    fill(buf.addr + off, off, ln, seed & 0xFF)
                    emit("OK")
                else:
                    j = first_mismatch(buf.addr + off, off, ln, seed & 0xFF)
                    emit("OK" if j < 0 else "BAD %d" % (off + j))
            elif cmd == "NOTIFIES":
                items = [[n.name, n.msg] for n in te.get_notifies()]
                emit("NOTIFIES " + json.dumps(items))
            elif cmd == "PING":
                emit("PONG")
            else:
                emit("ERR unknown command %s" % cmd)
        except Exception as e:  # keep serving; report the problem
            emit("ERR %s" % str(e).replace("\n", " "))
    log("stdin EOF, exiting")
    return 0


# ---------------------------------------------------------------------------------------------
# initiator


def run_initiator(args):
    result = {"done": False}
    lock = threading.Lock()

    def finish(ok, msg):
        with lock:
            if result["done"]:
                return
            result["done"] = True
            emit("RESULT %s %s" % ("ok" if ok else "fail", msg))
        hard_exit(0 if ok else 1)

    if args.timeout > 0:
        wd = threading.Timer(args.timeout, lambda: finish(False, "timeout after %ss" % args.timeout))
        wd.daemon = True
        wd.start()

    if args.size <= 0 or args.block <= 0:
        finish(False, "size and block must be > 0")
    try:
        te = make_engine(args.host)
        buf = Buffer(te, args.size, args.managed)
    except Exception as e:
        finish(False, "setup: %s" % e)

    remote = args.remote_addr
    if remote is None:
        remote = te.get_first_buffer_address(args.segment)
        if not remote:
            finish(False, "cannot resolve segment %s (get_first_buffer_address returned 0)" % args.segment)
    seed = args.seed & 0xFF
    base = args.pattern_base

    if args.op == "write":
        fill(buf.addr, base, args.size, seed)
    else:
        ctypes.memset(buf.addr, 0, args.size)

    blocks = []
    off = 0
    while off < args.size:
        n = min(args.block, args.size - off)
        blocks.append((buf.addr + off, remote + off, n))
        off += n

    t0 = time.time()
    if args.mode == "single":
        fn = te.transfer_sync_write if args.op == "write" else te.transfer_sync_read
        for (la, ra, n) in blocks:
            rc = fn(args.segment, la, ra, n)
            if rc != 0:
                finish(False, "transfer_sync_%s returned %d at offset %d len %d"
                       % (args.op, rc, la - buf.addr, n))
    else:
        fn = te.batch_transfer_sync_write if args.op == "write" else te.batch_transfer_sync_read
        for i in range(0, len(blocks), args.batch_max):
            chunk = blocks[i:i + args.batch_max]
            rc = fn(args.segment, [b[0] for b in chunk], [b[1] for b in chunk], [b[2] for b in chunk])
            if rc != 0:
                finish(False, "batch_transfer_sync_%s returned %d for blocks at offset %d (%d blocks)"
                       % (args.op, rc, chunk[0][0] - buf.addr, len(chunk)))
    dt = time.time() - t0
    log("%s %d bytes in %d blocks of <=%d: %.3fs" % (args.op, args.size, len(blocks), args.block, dt))

    if args.op == "read":
        j = first_mismatch(buf.addr, base, args.size, seed)
        if j >= 0:
            got = ctypes.string_at(buf.addr + j, 1)[0]
            finish(False, "mismatch at offset %d: got 0x%02x want 0x%02x"
                   % (j, got, ((base + j) * 131 + seed) & 0xFF))
    finish(True, str(args.size))
    return 0


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="role", required=True)

    t = sub.add_parser("target")
    t.add_argument("--size", type=parse_int, required=True)
    t.add_argument("--seed", type=parse_int, default=7)
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--managed", action="store_true", help="use allocate_managed_buffer")
    t.add_argument("--max-lifetime", type=float, default=1800.0,
                   help="exit(3) after this many seconds (0 = never)")

    i = sub.add_parser("initiator")
    i.add_argument("--segment", required=True)
    i.add_argument("--remote-addr", type=parse_int, default=None)
    i.add_argument("--size", type=parse_int, required=True)
    i.add_argument("--op", choices=["write", "read"], required=True)
    i.add_argument("--block", type=parse_int, required=True)
    i.add_argument("--seed", type=parse_int, default=7)
    i.add_argument("--pattern-base", type=parse_int, default=0)
    i.add_argument("--host", default="127.0.0.1")
    i.add_argument("--managed", action="store_true")
    i.add_argument("--mode", choices=["batch", "single"], default="batch")
    i.add_argument("--batch-max", type=parse_int, default=128)
    i.add_argument("--timeout", type=float, default=120.0, help="watchdog, seconds (0 = none)")

    args = ap.parse_args()
    try:
        rc = run_target(args) if args.role == "target" else run_initiator(args)
    except Exception as e:
        if args.role == "initiator":
            emit("RESULT fail %s" % str(e).replace("\n", " "))
        else:
            emit("ERROR %s" % str(e).replace("\n", " "))
        hard_exit(1)
    hard_exit(rc)


if __name__ == "__main__":
    main()
