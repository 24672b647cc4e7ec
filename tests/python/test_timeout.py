"""Transfers to a peer that never answers: sync calls give up after MC_TRANSFER_TIMEOUT (with
the GIL released meanwhile), async batches report a timeout, and nothing leaks."""
import subprocess
import sys
import threading
import time

import pytest

from mc_helpers import HERE, HostBuffer, engine


@pytest.fixture
def stalled_peer():
    proc = subprocess.Popen([sys.executable, str(HERE / "stall_peer.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    tag, segment, addr, size = proc.stdout.readline().split()
    assert tag == "ready"
    yield segment, int(addr)
    proc.stdin.close()
    proc.kill()
    proc.wait()


def test_stalled_peer(stalled_peer, monkeypatch, capfd):
    segment, remote = stalled_peer
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")   # below the minimum: 5 s are used
    monkeypatch.setenv("MC_SLICE_TIMEOUT", "8")      # the engine fails the stalled requests then
    e = engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = HostBuffer(1 << 16)
    assert e.register_memory(buf.addr, buf.size) == 0
    assert e.send_probe(segment) == 0

    results = {}

    def sync_call():
        t0 = time.monotonic()
        results["rc"] = e.transfer_sync_write(segment, buf.addr, remote, 4096)
        results["elapsed"] = time.monotonic() - t0

    t0 = time.monotonic()
    th = threading.Thread(target=sync_call)
    th.start()
    b1 = e.batch_transfer_async_write(segment, [buf.addr], [remote], [4096])
    b2 = e.transfer_submit_write(segment, buf.addr, remote + 8192, 4096)
    assert b1 and b2
    assert e.transfer_check_status(b2) == 0
    # While the sync call blocks in another thread, this thread keeps running Python.
    last, max_gap = time.monotonic(), 0.0
    while th.is_alive() and time.monotonic() - t0 < 2:
        now = time.monotonic()
        max_gap, last = max(max_gap, now - last), now
    assert max_gap < 0.5, f"the GIL was held for {max_gap:.2f} s during a sync transfer"
    assert e.get_batch_transfer_status([b1]) == -1
    th.join()
    waited = time.monotonic() - t0
    assert results["rc"] == -1
    assert 4.5 <= results["elapsed"] <= 12, results
    assert 4.5 <= waited <= 12
    assert e.transfer_check_status(b2) == -2, "past its deadline"
    assert e.transfer_check_status(b2) == -1, "reported once"
    err = capfd.readouterr().err
    assert "MC_TRANSFER_TIMEOUT=1 is below the minimum" in err
    assert err.count("timed out (MC_TRANSFER_TIMEOUT 5 s") >= 3, err

    # The three batches are freed once the engine fails their requests (MC_SLICE_TIMEOUT).
    assert e._pending_batches() == 3
    deadline = time.monotonic() + 30
    while e._pending_batches():
        assert time.monotonic() < deadline, "abandoned batches were never freed"
        time.sleep(0.2)
        e.get_batch_transfer_status([])
