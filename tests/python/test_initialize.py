"""initialize / initialize_ext: protocols, metadata servers, host names."""
import os
import re
import subprocess
import sys
import time

import pytest

from mc_helpers import closed_port_segment, engine, make_engine, segment_of


def warning_lines(err, word):
    return [l for l in err.splitlines() if re.match(r"^[WE]\d", l) and word in l]


@pytest.mark.parametrize("protocol", ["tcp", ""])
def test_initialize_p2p(protocol, capfd):
    e = engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    port = e.get_rpc_port()
    assert 15000 <= port <= 17000
    assert f"listening on 127.0.0.1:{port}" in capfd.readouterr().err


def test_port_in_local_hostname_is_ignored_under_p2p():
    a, b = engine.TransferEngine(), engine.TransferEngine()
    assert a.initialize("127.0.0.1:16001", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1:16001", "P2PHANDSHAKE", "tcp", "") == 0
    assert a.get_rpc_port() != b.get_rpc_port()
    assert a.send_probe(segment_of(b)) == 0


def test_rdma_falls_back_to_the_best_transport_with_one_warning(capfd):
    e = engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    err = capfd.readouterr().err
    assert len(warning_lines(err, "rdma")) == 1, err
    # and it moves data to a tcp-only peer
    peer = make_engine("tcp")
    from mc_helpers import HostBuffer
    src, dst = HostBuffer(4096, fill=7), HostBuffer(4096)
    assert e.register_memory(src.addr, src.size) == 0
    assert peer.register_memory(dst.addr, dst.size) == 0
    assert e.transfer_sync_write(segment_of(peer), src.addr, dst.addr, 4096) == 0
    assert dst.read() == bytes([7]) * 4096


@pytest.mark.parametrize("protocol", ["nvlink", "efa", "bogus"])
def test_protocol_not_built_fails_naming_it(protocol, capfd):
    e = engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == -1
    err = capfd.readouterr().err
    lines = warning_lines(err, f"'{protocol}'")
    assert lines and "not built" in lines[-1], err
    assert e.get_engine() is None
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, "a failed initialize can be retried"


def test_protocol_ascend_without_acl_fails_naming_what_to_install(capfd):
    """protocol "ascend" selects the NPU backend; without the ACL runtime it fails at once."""
    if os.environ.get("MC_DEVICE_SIM"):
        pytest.skip("simulated devices")
    e = engine.TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", "")
    if rc == 0:
        pytest.skip("an Ascend runtime and NPU are usable here")
    assert rc == -1
    lines = warning_lines(capfd.readouterr().err, "'ascend'")
    assert lines and "libascendcl.so" in lines[-1] and "set_env.sh" in lines[-1], lines
    assert e.get_engine() is None
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0


@pytest.mark.parametrize("server", ["zookeeper://127.0.0.1:2181", "etcd://{closed}",
                                    "{closed}", "redis://{closed}", "http://{closed}/metadata"])
def test_metadata_server_unavailable_fails_clearly(server, capfd):
    """Stores this build lacks, or that nobody serves, fail initialize with a line naming them."""
    closed = closed_port_segment()
    server = server.format(closed=closed)
    e = engine.TransferEngine()
    t0 = time.monotonic()
    assert e.initialize("127.0.0.1", server, "tcp", "") == -1
    assert time.monotonic() - t0 < 30
    expected = server if "://" in server else "etcd://" + server
    lines = warning_lines(capfd.readouterr().err, expected)
    assert lines and "initialize" in lines[-1]


def test_initialize_ext():
    e = engine.TransferEngine()
    assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "etcd") == 0
    f = engine.TransferEngine()
    assert f.initialize_ext("127.0.0.1", closed_port_segment(), "tcp", "", "redis") == -1


def test_second_initialize_fails(capfd):
    e = make_engine()
    port = e.get_rpc_port()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert "initialized already" in capfd.readouterr().err
    assert e.get_rpc_port() == port


@pytest.mark.parametrize("name", ["", ":123", "[::1"])
def test_bad_local_hostname(name, capfd):
    e = engine.TransferEngine()
    assert e.initialize(name, "P2PHANDSHAKE", "tcp", "") == -1
    assert warning_lines(capfd.readouterr().err, "initialize")


def test_get_engine():
    e = make_engine()
    inner = e.get_engine()
    assert isinstance(inner, engine.InnerTransferEngine)
    assert segment_of(e) in repr(inner)
    assert e.get_engine_ptr() != 0
    del e  # the inner engine keeps it alive
    assert "InnerTransferEngine" in repr(inner)


@pytest.mark.parametrize("level,info_lines", [("WARNING", False), ("INFO", True)])
def test_mc_log_level(level, info_lines):
    code = ("from mooncake.engine import TransferEngine as T; e = T(); "
            "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0; "
            "assert e.register_memory(0, 1) == -1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "MC_LOG_LEVEL": level})
    assert out.returncode == 0, out.stderr
    assert any(l.startswith("I") for l in out.stderr.splitlines()) == info_lines, out.stderr
    assert "register_memory(0x0, 1)" in out.stderr
