"""Standalone storage: mooncake_client (the real client, lending the memory) and dummy clients
(MooncakeDistributedStore.setup_dummy) in other processes of the host, as SGLang's standalone
HiCache path runs them: a master, one real client and two dummies, each its own process.

Dummies get their master / metadata server / protocol from the real client over its --port
and run store clients of their own with no segment; their objects land in the real client's
segment. The real client killed: dummies' calls fail within a bounded time; restarted on the
same --port: they work again.
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from store_helpers import (Master, StoreProc, free_port, metadata_server, terminate, wait_until,
                           _tail)

CLIENT_BIN = pathlib.Path(sys.executable).parent / "mooncake_client"


def hello(port, timeout=1.0):
    """The config line the real client on `port` answers the dummy hello with ('' if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"MOONCAKE-DUMMY 1\n")
            buf = b""
            while b"\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return buf.split(b"\n")[0].decode()
    except OSError:
        return ""


class RealClient:
    """mooncake_client on a free --port (or the given one), serving when constructed."""

    def __init__(self, master, metadata="P2PHANDSHAKE", segment="64 MB", port=None, extra=()):
        if not CLIENT_BIN.exists():
            raise AssertionError(f"{CLIENT_BIN} is missing: run scripts/python_test.sh")
        self.port = port or free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="mc_client_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(CLIENT_BIN), "--host=127.0.0.1", f"--port={self.port}",
             f"--master_server_address={master.addr}", f"--metadata_server={metadata}",
             f"--global_segment_size={segment}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: self.proc.poll() is not None or hello(self.port), 20,
                       what="mooncake_client to serve")
        except AssertionError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise AssertionError("mooncake_client exited:\n" + _tail(self.log.name))

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self):
        terminate(self.proc)
        self.log.close()


def dummy(real, pool=32 << 20, lbuf=16 << 20):
    p = StoreProc(None, setup=False)
    rc = p.call("result = store.setup_dummy(pool, lbuf, addr)", pool=pool, lbuf=lbuf,
                addr=real.addr)
    assert rc == 0, f"setup_dummy returned {rc}:\n" + _tail(p.log.name)
    p.call("import ctypes")
    return p


@pytest.fixture
def cluster():
    """A master, a real client (64 MiB) and two dummies; yields (master, real, [a, b])."""
    made = []
    with Master() as m:
        real = RealClient(m)
        try:
            a, b = dummy(real), dummy(real)
            made += [a, b]
            yield m, real, [a, b]
        finally:
            for p in made:
                p.close()
            real.stop()


def test_dummies_share_objects_through_the_real_client(cluster):
    m, real, (a, b) = cluster
    # Only the real client lends memory; the dummies' clients mount nothing.
    assert m.metric("master_mounted_segments") == 1
    sizes = [1, 4096, (1 << 20) + 3, 9 << 20]
    assert a.call("result = [store.put(f'k{i}', data(i, n)) for i, n in enumerate(sizes)]",
                  sizes=sizes) == [0] * len(sizes)
    assert b.call("result = [store.get(f'k{i}') == data(i, n) for i, n in enumerate(sizes)]",
                  sizes=sizes) == [True] * len(sizes)
    assert b.call("result = [store.is_exist('k0'), store.get_size('k2'), store.is_exist('nope'),"
                  " store.get('nope')]") == [1, (1 << 20) + 3, 0, b""]
    # put_batch / get_batch, both ways.
    assert b.call("result = store.put_batch(['b0', 'b1'], [data(10, 100), data(11, 5000)])") == 0
    assert a.call("result = store.get_batch(['b0', 'b1', 'nope']) == "
                  "[data(10, 100), data(11, 5000), b'']") is True
    # Zero copy through the memory pool: batch_put_from in a, batch_get_into in b.
    assert a.call("""
n = 1 << 20
ptrs = [store.alloc_from_mem_pool(n) for _ in range(3)]
for i, p in enumerate(ptrs):
    ctypes.memmove(p, data(20 + i, n), n)
result = store.batch_put_from(['z0', 'z1', 'z2'], ptrs, [n] * 3)""") == [0, 0, 0]
    assert b.call("""
n = 1 << 20
ptrs = [store.alloc_from_mem_pool(n) for _ in range(3)]
# Registering a range of the pool (as upstream's users do) succeeds; so does undoing it.
regs = [store.register_buffer(ptrs[0], 3 * n), store.register_buffer(ptrs[0], 3 * n)]
got = store.batch_get_into(['z0', 'z1', 'z2', 'nope'], ptrs + [ptrs[0]], [n] * 4)
ok = [ctypes.string_at(p, n) == data(20 + i, n) for i, p in enumerate(ptrs)]
regs += [store.unregister_buffer(ptrs[0]), store.unregister_buffer(ptrs[0]),
         store.unregister_buffer(ptrs[0]) < 0]
result = [got, ok, regs]""") == [[1 << 20] * 3 + [-704], [True] * 3, [0, 0, 0, 0, True]]
    # get_into a registered MooncakeHostMemAllocator buffer (SGLang's host KV pool).
    assert b.call("""
from mooncake.store import MooncakeHostMemAllocator
alloc = MooncakeHostMemAllocator()
h = alloc.alloc(4 << 20)
assert store.register_buffer(h, 4 << 20) == 0
ctypes.memmove(h, data(30, 3 << 20), 3 << 20)
r1 = store.put_from('h0', h, 3 << 20)
r2 = store.get_into('k2', h + (3 << 20), 1 << 20)  # too small: k2 is 1 MiB + 3
r3 = store.get_into('k1', h + (3 << 20), 4096)
ok = ctypes.string_at(h + (3 << 20), 4096) == data(1, 4096)
result = [r1, r2 < 0, r3, ok, store.unregister_buffer(h), alloc.free(h), alloc.free(h)]""") == [
        0, True, 4096, True, 0, 0, -1]
    assert a.call("result = store.get('h0') == data(30, 3 << 20)") is True
    # Ranged reads into a registered range of the pool are bounded by that range, not by the
    # whole pool (as if the range were registered by itself).
    assert b.call("""
p = store.alloc_from_mem_pool(64)
assert store.register_buffer(p, 32) == 0
inside = store.get_into_ranges([p], [['k1']], [[[0]]], [[[8]]], [[[4]]])
past = store.get_into_ranges([p], [['k1']], [[[30]]], [[[0]]], [[[4]]])
ok = ctypes.string_at(p, 4) == data(1, 4096)[8:12]
result = [inside, past[0][0][0] < 0, ok, store.unregister_buffer(p)]""") == [
        [[[4]]], True, True, 0]
    # Tensors of 1 MiB or more are registered local-only for the call (not staged): through a
    # dummy too, written by one and read by the other.
    if a.call("import importlib.util; result = importlib.util.find_spec('torch') is not None"):
        assert a.call("import torch; t = torch.arange(1 << 20, dtype=torch.float32); "
                      "result = store.put_tensor('t0', t)") == 0
        assert b.call("import torch; t = store.get_tensor('t0'); "
                      "result = t is not None and torch.equal(t, torch.arange(1 << 20, "
                      "dtype=torch.float32))") is True
    # The bytes went over the same-host transport (one copy, by the real client's engine).
    for p in (a, b):
        assert "using transport shm" in pathlib.Path(p.log.name).read_text(errors="replace")
    # Removal seen by the other dummy.
    assert a.call("result = store.remove('k0', True)") == 0
    assert b.call("result = store.is_exist('k0')") == 0
    assert b.call("result = store.remove_by_regex('^z', True)") == 3
    assert a.call("result = store.batch_is_exist(['z0', 'k1'])") == [0, 1]


def test_alloc_from_mem_pool_bounds():
    with Master() as m:
        real = RealClient(m)
        p = dummy(real, pool=4 << 20)
        try:
            got = p.call("""
a = store.alloc_from_mem_pool(3 << 20)
b = store.alloc_from_mem_pool(2 << 20)          # does not fit what is left
c = store.alloc_from_mem_pool(1 << 20)          # does
result = [a, b, c, store.alloc_from_mem_pool(5 << 20), store.alloc_from_mem_pool(0),
          store.alloc_from_mem_pool(1 << 62)]""")
            a, b, c, too_big, zero, huge = got
            assert a != 0 and c != 0 and a % 64 == 0 and c % 64 == 0
            assert b == 0 and too_big == 0 and zero == 0 and huge == 0
            assert abs(c - a) >= 1 << 20
        finally:
            p.close()
            real.stop()
        # A store set up with setup() has no pool.
        plain = StoreProc(m)
        try:
            assert plain.call("result = store.alloc_from_mem_pool(4096)") == 0
        finally:
            plain.close()


def test_setup_dummy_without_a_real_client_fails_fast():
    p = StoreProc(None, setup=False)
    try:
        port = free_port()  # nothing listens there
        t0 = time.monotonic()
        assert p.call("result = store.setup_dummy(1 << 20, 1 << 20, addr)",
                      addr=f"127.0.0.1:{port}") == -900
        assert time.monotonic() - t0 < 8
        assert p.call("result = store.setup_dummy(1 << 20, 1 << 20, 'no-port')") == -900
        assert p.call("result = [store.put('k', b'v'), store.get('k')]") == [-1, b""]
    finally:
        p.close()


def test_real_client_killed_then_restarted(cluster):
    m, real, (a, b) = cluster
    assert a.call("result = store.put('before', data(1, 1 << 20))") == 0
    real.kill()
    # Every call fails (no hang) once the loss is seen: at once for a closed connection.
    t0 = time.monotonic()
    wait_until(lambda: a.call("result = store.put('after', b'x')") < 0, 5,
               what="put to fail after the real client died")
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    assert b.call("result = [store.get('before'), store.is_exist('before'), "
                  "store.get_size('before'), store.get_into('before', 0, 0)]") == [
        b"", -1, -1, -1]
    assert b.call("result = store.batch_put_from(['x'], [store.alloc_from_mem_pool(64)], "
                  "[64])") == [-1]
    assert b.call("result = store.get_hostname()") != ""  # its own name stays
    assert time.monotonic() - t0 < 5
    # Restarted on the same --port: the dummies reconnect (every second) and work again; what
    # was stored in the old real client's segment is gone.
    real2 = RealClient(m, port=real.port)
    try:
        wait_until(lambda: a.call("result = store.put('again', data(2, 4096))") == 0, 15,
                   what="the dummy to work with the restarted real client")
        wait_until(lambda: b.call("result = store.get('again') == data(2, 4096)"), 15,
                   what="the other dummy to read through the restarted real client")
        wait_until(lambda: b.call("result = store.get('before')") == b"", 15,
                   what="the old segment's objects to be gone")
    finally:
        real2.stop()


def test_a_stopped_real_client_is_noticed_by_its_silence(cluster):
    """SIGSTOP keeps the connection open but silences the heartbeat: the dummies fail calls
    within kLostAfter (3 s) plus a margin, and work again once it continues."""
    m, real, (a, b) = cluster
    assert a.call("result = store.put('s', data(4, 4096))") == 0
    os.kill(real.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        wait_until(lambda: b.call("result = store.is_exist('s')") == -1, 6,
                   what="the dummy to notice the silent real client")
        assert time.monotonic() - t0 < 6
        assert a.call("result = store.get('s')") == b""
    finally:
        os.kill(real.proc.pid, signal.SIGCONT)
    wait_until(lambda: b.call("result = store.get('s') == data(4, 4096)"), 15,
               what="the dummy to reconnect after SIGCONT")


def test_garbage_connections_do_not_stop_a_dummy():
    with Master() as m:
        real = RealClient(m)
        socks = []
        made = []
        try:
            # Silent connections, garbage, a hello-like prefix never finished, a flood with no
            # newline, a half-sent hello, a binary blob.
            for i in range(40):
                s = socket.create_connection(("127.0.0.1", real.port), timeout=2)
                if i % 4 == 1:
                    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
                elif i % 4 == 2:
                    s.sendall(b"MOONCAKE-DUMMY")
                elif i % 4 == 3:
                    try:
                        s.sendall(os.urandom(1 << 16))
                    except OSError:
                        pass
                socks.append(s)
            t0 = time.monotonic()
            d = dummy(real)
            made.append(d)
            assert time.monotonic() - t0 < 10
            assert d.call("result = store.put('g', data(3, 1 << 20))") == 0
            assert d.call("result = store.get('g') == data(3, 1 << 20)") is True
            # The bad ones are closed within the hello deadline (2 s); the real client lives.
            time.sleep(2.5)
            for s in socks:
                s.settimeout(2)
                try:
                    assert s.recv(10) == b""
                except ConnectionResetError:
                    pass
            assert real.proc.poll() is None
            assert d.call("result = store.is_exist('g')") == 1
        finally:
            for s in socks:
                s.close()
            for p in made:
                p.close()
            real.stop()


def test_mooncake_client_refuses_bad_flags():
    with Master() as m:
        for flags in (["--global_segment_size=lots"], ["--local_buffer_size=1 XB"], ["--port=0"],
                      ["--tenant_id=_reserved"], ["--tenant_id="]):
            r = subprocess.run([str(CLIENT_BIN), f"--master_server_address={m.addr}",
                                "--metadata_server=P2PHANDSHAKE", "--global_segment_size=1MB",
                                *flags], capture_output=True, text=True, timeout=30)
            assert r.returncode != 0, flags
        # Its --port in use: exits with a message instead of serving nothing.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            r = subprocess.run([str(CLIENT_BIN), f"--master_server_address={m.addr}",
                                "--metadata_server=P2PHANDSHAKE", "--global_segment_size=1MB",
                                "--host=127.0.0.1", f"--port={port}"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and "--port" in r.stderr


@pytest.fixture
def http_metadata():
    with metadata_server("http") as url:
        yield url


def test_dummies_under_an_http_metadata_server(http_metadata):
    """Real client and dummies all named 127.0.0.1 under one metadata server: each gets its own
    127.0.0.1:<port> segment name."""
    with Master() as m:
        real = RealClient(m, metadata=http_metadata)
        made = []
        try:
            a, b = dummy(real), dummy(real)
            made += [a, b]
            names = {a.call("result = store.get_hostname()"),
                     b.call("result = store.get_hostname()")}
            assert len(names) == 2 and all(n.startswith("127.0.0.1:") for n in names), names
            assert a.call("result = store.put('m', data(5, 3 << 20))") == 0
            assert b.call("result = store.get('m') == data(5, 3 << 20)") is True
        finally:
            for p in made:
                p.close()
            real.stop()
