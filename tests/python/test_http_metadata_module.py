"""`python -m mooncake.http_metadata_server` (python/mooncake/http_metadata_server.py): upstream's
flags and protocol, its bounds against hostile clients, and two engines that find each other
through it."""
import http.client
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mooncake.http_metadata_server",
                    reason="mooncake is not installed in this interpreter; run scripts/python_test.sh")
from mooncake.http_metadata_server import KVBootstrapServer, KVPoll  # noqa: E402


def start_module(*args):
    """The module in a child process on a free port; (process, port)."""
    p = subprocess.Popen([sys.executable, "-m", "mooncake.http_metadata_server",
                          "--host", "127.0.0.1", "--port", "0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        p.kill()
        raise AssertionError(f"did not start: {line!r} {p.stderr.read()}")
    return p, int(line.rsplit(":", 1)[1])


@pytest.fixture
def module_server():
    p, port = start_module("--max-body-bytes", "65536")
    yield port
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0


@pytest.fixture
def inproc():
    s = KVBootstrapServer(port=0, host="127.0.0.1", head_timeout=0.5, keep_alive_timeout=0.5,
                          max_connections=64)
    s.run()
    assert s.poll() == KVPoll.Success, s.error
    yield s
    s.close()


def request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read(), r.getheader("Content-Type")
    finally:
        c.close()


def raw(port, data, timeout=5.0):
    """Sends `data` and reads until the server closes; the bytes it sent back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
    return out


def test_protocol(module_server):
    port = module_server
    assert request(port, "GET", "/metadata?key=nothing")[:2] == (404, b"metadata not found")
    status, body, ctype = request(port, "PUT", "/metadata?key=k1", b'{"a":1}')
    assert (status, body) == (200, b"metadata updated")
    assert ctype.startswith("application/json")
    assert request(port, "GET", "/metadata?key=k1")[:2] == (200, b'{"a":1}')
    # The key is stripped; a missing, empty or blank key is 400 for every method.
    assert request(port, "GET", "/metadata?key=%20k1%20")[:2] == (200, b'{"a":1}')
    for method in ("GET", "PUT", "DELETE"):
        for q in ("", "?key=", "?key=%20%20", "?other=1"):
            assert request(port, method, "/metadata" + q, b"v")[:2] == \
                (400, b"metadata key is required"), (method, q)
    assert request(port, "POST", "/metadata?key=k1", b"v")[0] == 405
    assert request(port, "GET", "/other?key=k1")[0] == 404
    # rpc_meta: a different value is refused, the same one accepted.
    assert request(port, "PUT", "/metadata?key=mooncake/rpc_meta/a", b"x")[0] == 200
    assert request(port, "PUT", "/metadata?key=mooncake/rpc_meta/a", b"y")[:2] == \
        (400, b"Duplicate rpc_meta key not allowed")
    assert request(port, "PUT", "/metadata?key=mooncake/rpc_meta/a", b"x")[0] == 200
    assert request(port, "DELETE", "/metadata?key=k1")[:2] == (200, b"metadata deleted")
    assert request(port, "DELETE", "/metadata?key=k1")[0] == 404
    # Binary values and keys with escapes round-trip.
    value = bytes(range(256)) * 4
    assert request(port, "PUT", "/metadata?key=a%2Fb%26c", value)[0] == 200
    assert request(port, "GET", "/metadata?key=a/b%26c")[:2] == (200, value)


def test_keep_alive_chunked_and_expect(module_server):
    port = module_server
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(3):  # one connection, several requests
        c.request("PUT", f"/metadata?key=ka{i}", body=b"v%d" % i)
        r = c.getresponse()
        assert (r.status, r.read()) == (200, b"metadata updated")
    c.request("GET", "/metadata?key=ka2")
    assert c.getresponse().read() == b"v2"
    c.close()
    # A chunked body, and a client that waits for 100 Continue.
    out = raw(port, b"PUT /metadata?key=ch HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: close\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 "), out
    assert request(port, "GET", "/metadata?key=ch")[1] == b"abcde"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"PUT /metadata?key=ex HTTP/1.1\r\nContent-Length: 2\r\n"
                  b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(b"ok")
        assert b" 200 " in s.recv(4096)
    assert request(port, "GET", "/metadata?key=ex")[1] == b"ok"


def test_bounds(module_server):
    port = module_server
    # --max-body-bytes 65536: one byte more is 413, whether announced or chunked.
    assert request(port, "PUT", "/metadata?key=big", b"a" * 65536)[0] == 200
    assert request(port, "PUT", "/metadata?key=big", b"a" * 65537)[0] == 413
    out = raw(port, b"PUT /metadata?key=big2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"10001\r\n" + b"a" * 65537 + b"\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413 "), out[:80]
    # A head over 8 KiB, garbage, a bad length.
    assert raw(port, b"GET /metadata?key=" + b"k" * 10000 + b" HTTP/1.1\r\n\r\n") \
        .startswith(b"HTTP/1.1 431 ")
    assert raw(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(port, b"PUT /metadata?key=x HTTP/1.1\r\nContent-Length: -1\r\n\r\n") \
        .startswith(b"HTTP/1.1 400 ")
    assert raw(port, b"PUT /metadata?key=x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") \
        .startswith(b"HTTP/1.1 501 ")
    # Still serving.
    assert request(port, "GET", "/metadata?key=big")[0] == 200


def test_store_total_is_bounded():
    s = KVBootstrapServer(port=0, host="127.0.0.1", max_total_bytes=1000)
    s.run()
    try:
        assert request(s.port, "PUT", "/metadata?key=a", b"x" * 900)[0] == 200
        assert request(s.port, "PUT", "/metadata?key=b", b"x" * 200)[0] == 507
        assert request(s.port, "PUT", "/metadata?key=a", b"x" * 990)[0] == 200  # replaces
        assert request(s.port, "DELETE", "/metadata?key=a")[0] == 200
        assert request(s.port, "PUT", "/metadata?key=b", b"x" * 200)[0] == 200
    finally:
        s.close()


def test_idle_and_slow_clients_do_not_stall_it(inproc):
    port = inproc.port
    idle = []
    for i in range(40):  # idle, half a head, half a body
        s = socket.create_connection(("127.0.0.1", port))
        if i % 3 == 1:
            s.sendall(b"GET /metadata?ke")
        elif i % 3 == 2:
            s.sendall(b"PUT /metadata?key=s HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")
        idle.append(s)
    t0 = time.monotonic()
    assert request(port, "PUT", "/metadata?key=live", b"1")[0] == 200
    assert request(port, "GET", "/metadata?key=live")[:2] == (200, b"1")
    assert time.monotonic() - t0 < 1.0
    # The idle ones and the half heads are closed at the head timeout (0.5 s here).
    time.sleep(1.0)
    closed = 0
    for s in idle[::3] + idle[1::3]:
        s.settimeout(2)
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
    assert closed == len(idle[::3]) + len(idle[1::3])
    for s in idle:
        s.close()
    assert "s" not in inproc.store  # the cut body stored nothing


def test_connection_cap(inproc):
    held = [socket.create_connection(("127.0.0.1", inproc.port)) for _ in range(64)]
    time.sleep(0.2)
    out = raw(inproc.port, b"GET /metadata?key=x HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 503 "), out
    for s in held:
        s.close()
    time.sleep(0.7)
    assert request(inproc.port, "GET", "/metadata?key=x")[0] == 404


def test_port_in_use_and_flags():
    p, port = start_module()
    try:
        second = subprocess.run([sys.executable, "-m", "mooncake.http_metadata_server",
                                 "--host", "127.0.0.1", "--port", str(port)],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "cannot listen" in second.stderr and "in use" in second.stderr, second.stderr
        # The first still holds every key.
        assert request(port, "PUT", "/metadata?key=k", b"v")[0] == 200
        assert request(port, "GET", "/metadata?key=k")[1] == b"v"
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    bad = subprocess.run([sys.executable, "-m", "mooncake.http_metadata_server", "--port", "x"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    usage = subprocess.run([sys.executable, "-m", "mooncake.http_metadata_server", "--help"],
                           capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0 and "--port" in usage.stdout and "--host" in usage.stdout


def test_engines_find_each_other_through_it(module_server):
    engine = pytest.importorskip("mooncake.engine")
    from mc_helpers import HostBuffer

    url = f"http://127.0.0.1:{module_server}/metadata"
    names = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            names.append(f"127.0.0.1:{s.getsockname()[1]}")
    target, initiator = engine.TransferEngine(), engine.TransferEngine()
    assert target.initialize(names[0], url, "tcp", "") == 0
    assert initiator.initialize(names[1], url, "tcp", "") == 0
    tbuf, ibuf = HostBuffer(1 << 16), HostBuffer(1 << 16, fill=0x5A)
    assert target.register_memory(tbuf.addr, tbuf.size) == 0
    assert initiator.register_memory(ibuf.addr, ibuf.size) == 0
    # The target's descriptor is in the server.
    status, desc, _ = request(module_server, "GET", f"/metadata?key=mooncake/ram/{names[0]}")
    assert status == 200 and b'"buffers"' in desc
    assert initiator.transfer_sync_write(names[0], ibuf.addr, tbuf.addr, ibuf.size) == 0
    assert tbuf.read() == ibuf.read()
    assert initiator.unregister_memory(ibuf.addr) == 0
    assert target.unregister_memory(tbuf.addr) == 0
    del target, initiator
