"""The client's metrics and HTTP port, as upstream's client serves them:
setup(..., enable_client_http_server=True, client_http_port=P) (and the dict form) and
`mooncake_client --enable_http_server --http_port=P` answer GET /metrics (upstream's
mooncake_transfer_* / mooncake_client_rpc_* families, client_mode label), /metrics/summary and
/health; MC_STORE_CLIENT_METRIC=0 turns the metrics off (503); a bad port fails setup (-600),
a port in use does not."""
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from store_helpers import (Master, StoreProc, free_port, new_store, store_fixtures, terminate,
                           wait_until, _tail)

master, holder, store = store_fixtures(lease_ms=500, holder_segment=64 << 20)
CLIENT_BIN = pathlib.Path(sys.executable).parent / "mooncake_client"
promtool = shutil.which("promtool")


def fetch(port, path):
    """(status, content type, body) of GET path on 127.0.0.1:port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def samples(text):
    """{'name{labels}': value} of a Prometheus exposition."""
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            k, v = ln.rsplit(" ", 1)
            out[k] = float(v)
    return out


@pytest.fixture
def served(master):
    """A store (lending 32 MiB) with its HTTP port on; yields (store, port)."""
    port = free_port()
    s = new_store(master, global_segment_size=32 << 20, enable_client_http_server=True,
                  client_http_port=port)
    yield s, port
    s.remove_all(force=True)
    s.close()


def test_metrics_summary_and_health_follow_the_calls(served):
    s, port = served
    status, ctype, body = fetch(port, "/health")
    assert (status, ctype, body) == (200, "application/json", '{"status":"healthy","code":0}')
    value = os.urandom(100_000)
    assert s.put("k", value) == 0
    assert s.get("k") == value
    assert s.get_batch(["k", "missing"]) == [value, b""]
    buf = bytearray(100_000)
    import ctypes
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert s.register_buffer(ptr, len(buf)) == 0
    assert s.get_into("k", ptr, len(buf)) == 100_000
    assert s.batch_put_from(["a", "b"], [ptr, ptr], [10, 20]) == [0, 0]
    assert s.unregister_buffer(ptr) == 0
    status, ctype, body = fetch(port, "/metrics")
    assert status == 200 and ctype == "text/plain; version=0.0.4"
    m = samples(body)
    real = 'client_mode="real"'
    assert m[f"mooncake_transfer_write_bytes{{{real}}}"] == 100_030
    assert m[f"mooncake_transfer_read_bytes{{{real}}}"] == 300_000
    assert m[f'mooncake_transfer_write_operation_count{{{real},op_name="put"}}'] == 1
    assert m[f'mooncake_transfer_write_operation_bytes{{{real},op_name="batch_put_from"}}'] == 30
    assert m[f'mooncake_transfer_read_operation_count{{{real},op_name="get_buffer"}}'] == 1
    assert m[f'mooncake_transfer_read_operation_bytes{{{real},op_name="batch_get_buffer"}}'] == 100_000
    assert m[f'mooncake_transfer_read_operation_count{{{real},op_name="get_into"}}'] == 1
    assert m[f'mooncake_client_rpc_count{{{real},rpc_name="MountSegment"}}'] == 1
    assert m[f'mooncake_client_rpc_count{{{real},rpc_name="BatchGetReplicaList"}}'] == 1
    assert m[f'mooncake_client_rpc_count{{{real},rpc_name="BatchPutStart"}}'] == 1
    assert m[f"mooncake_transfer_put_latency_count{{{real}}}"] == 1
    assert m[f"mooncake_transfer_get_latency_count{{{real}}}"] == 2  # get and get_into
    assert m[f"mooncake_transfer_batch_get_latency_count{{{real}}}"] == 1
    status, ctype, body = fetch(port, "/metrics/summary")
    assert status == 200 and ctype == "text/plain"
    assert "Client Metrics Summary" in body and "Total Write: 97.69 KB" in body
    assert re.search(r"put: count=1, bytes=97\.66 KB, p95<\d+μs", body), body
    assert fetch(port, "/nothing")[0] == 404


@pytest.mark.skipif(promtool is None, reason="promtool missing (Debian package prometheus)")
def test_the_exposition_passes_promtool(served):
    s, port = served
    assert s.put("k", b"x" * 1000) == 0
    assert s.get("k") == b"x" * 1000
    body = fetch(port, "/metrics")[2]
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    # Upstream's names: counters without _total, latency in microseconds and the SSD
    # histograms' "_us" are lint notes.
    assert not any("error" in ln.lower() and "lint" not in ln.lower() for ln in problems), problems
    allowed = ("counter metrics should have \"_total\" suffix",
               "use base unit \"seconds\" instead of \"microseconds\"",
               "non-histogram and non-summary metrics should not have \"_count\" suffix",
               "metric names should not contain abbreviated units")
    assert all(any(a in ln for a in allowed) for ln in problems), problems


def test_ports_bad_ports_and_ports_in_use(master):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    for bad in (0, 70000, -1):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master.addr,
                       enable_client_http_server=True, client_http_port=bad) == -600
    # The dict form: strings with spaces, as upstream's parser takes them.
    port = free_port()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
           "global_segment_size": 0, "master_server_addr": master.addr,
           "enable_client_http_server": " true ", "client_http_port": f" {port} "}
    assert s.setup(dict(cfg, client_http_port="93x0")) == -600
    assert s.setup(cfg) == 0
    assert fetch(port, "/health")[0] == 200
    # A second store asking for the same port: set up, without the HTTP port.
    t = MooncakeDistributedStore()
    assert t.setup(cfg) == 0
    t.close()
    assert fetch(port, "/health")[0] == 200  # the first one's server, still serving
    s.close()
    with pytest.raises(OSError):
        fetch(port, "/health")  # gone with close()


def test_metrics_turned_off_answer_503(master):
    p = StoreProc(master, setup=False, env={"MC_STORE_CLIENT_METRIC": "off"})
    port = free_port()
    try:
        assert p.call("result = store.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 16 << 20, 'tcp', "
                      "'', addr, enable_client_http_server=True, client_http_port=port)",
                      addr=master.addr, port=port) == 0
        assert fetch(port, "/metrics") == (503, "text/plain", "metrics not available")
        assert fetch(port, "/metrics/summary")[0] == 503
        assert fetch(port, "/health")[0] == 200
    finally:
        p.close()


def test_mooncake_client_serves_its_port(master):
    if not CLIENT_BIN.exists():
        pytest.fail(f"{CLIENT_BIN} is missing: run scripts/python_test.sh")
    port, http = free_port(), free_port()
    log = open(os.devnull, "w")
    proc = subprocess.Popen([str(CLIENT_BIN), "--host=127.0.0.1", f"--port={port}",
                             f"--master_server_address={master.addr}",
                             "--metadata_server=P2PHANDSHAKE", "--global_segment_size=16MB",
                             "--enable_http_server", f"--http_port={http}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or fetch_ok(http), 20,
                   what="mooncake_client's HTTP port")
        assert proc.poll() is None
        assert fetch(http, "/health")[2] == '{"status":"healthy","code":0}'
        m = samples(fetch(http, "/metrics")[2])
        assert m['mooncake_client_rpc_count{client_mode="real",rpc_name="MountSegment"}'] == 1
    finally:
        terminate(proc)
    bad = subprocess.run([str(CLIENT_BIN), f"--master_server_address={master.addr}",
                          "--enable_http_server", "--http_port=0"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode != 0 and "--http_port" in bad.stderr


def fetch_ok(port):
    try:
        return fetch(port, "/health")[0] == 200
    except OSError:
        return False
