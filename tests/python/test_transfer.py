"""Transfers between two engines of this process: every method, results and error returns."""
import os
import threading
import time

import pytest

from mc_helpers import (HostBuffer, closed_port_segment, engine, make_engine, segment_of)

Read, Write, TransferNotify = engine.Read, engine.Write, engine.TransferNotify


def pattern(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def test_sync_write_and_read(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    for size, off in [(1, 0), (7, 3), (4096, 100), (65537, 5000), (1 << 20, 0)]:
        data = pattern(size, size)
        ibuf.write(data)
        assert initiator.transfer_sync_write(seg, ibuf.addr, tbuf.addr + off, size) == 0
        assert tbuf.read(off, size) == data
        ibuf.fill(0)
        assert initiator.transfer_sync_read(seg, ibuf.addr, tbuf.addr + off, size) == 0
        assert ibuf.read(0, size) == data


def test_transfer_sync_with_opcode_and_keywords(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    ibuf.write(b"hello")
    assert initiator.transfer_sync(target_hostname=segment_of(target), buffer=ibuf.addr,
                                   peer_buffer_address=tbuf.addr, length=5,
                                   opcode=engine.TransferOpcode.Write, transport_hint="") == 0
    assert tbuf.read(0, 5) == b"hello"
    assert initiator.transfer_sync(segment_of(target), ibuf.addr + 100, tbuf.addr, 5, Read) == 0
    assert ibuf.read(100, 5) == b"hello"


def test_batch_sync(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    n, blk = 16, 4096
    ibuf.write(pattern(n * blk))
    srcs = [ibuf.addr + i * blk for i in range(n)]
    dsts = [tbuf.addr + (n - 1 - i) * blk for i in range(n)]  # reversed order on the target
    assert initiator.batch_transfer_sync_write(seg, srcs, dsts, [blk] * n) == 0
    for i in range(n):
        assert tbuf.read((n - 1 - i) * blk, blk) == ibuf.read(i * blk, blk)
    reads = [ibuf.addr + (1 << 19) + i * blk for i in range(n)]
    assert initiator.batch_transfer_sync_read(seg, reads, dsts, [blk] * n) == 0
    assert ibuf.read(1 << 19, n * blk) == ibuf.read(0, n * blk)
    assert initiator.batch_transfer_sync(seg, srcs[:2], dsts[:2], [blk, blk], Write) == 0


def test_own_segment_is_a_local_copy(engine_pair):
    _, initiator, _, ibuf = engine_pair
    ibuf.write(b"local")
    assert initiator.transfer_sync_write(segment_of(initiator), ibuf.addr, ibuf.addr + 4096, 5) == 0
    assert ibuf.read(4096, 5) == b"local"


def test_zero_length_completes_without_moving(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    assert initiator.transfer_sync_write(seg, ibuf.addr, tbuf.addr, 0) == 0
    assert initiator.batch_transfer_sync_write(seg, [], [], []) == 0
    ibuf.write(b"xy")
    assert initiator.batch_transfer_sync_write(seg, [ibuf.addr, ibuf.addr], [tbuf.addr, tbuf.addr + 1],
                                               [0, 2]) == 0
    assert tbuf.read(0, 3) == b"\0xy"
    b = initiator.batch_transfer_async_write(seg, [ibuf.addr], [tbuf.addr], [0])
    assert b != 0 and initiator.get_batch_transfer_status([b]) == 0


def test_mismatched_lists(engine_pair, capfd):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    assert initiator.batch_transfer_sync_write(seg, [ibuf.addr], [tbuf.addr, tbuf.addr], [1]) == -1
    assert initiator.batch_transfer_sync_read(seg, [ibuf.addr], [tbuf.addr], [1, 2]) == -1
    assert initiator.batch_transfer_async_write(seg, [], [tbuf.addr], [1]) == 0
    assert initiator.batch_transfer_async(seg, [ibuf.addr], [tbuf.addr], [], Read) == 0
    assert capfd.readouterr().err.count("the lists differ in length") == 4


def test_unknown_peer_fails_fast(engine_pair, capfd):
    _, initiator, tbuf, ibuf = engine_pair
    for seg in [closed_port_segment(), "127.0.0.1", "", "///"]:
        t0 = time.monotonic()
        assert initiator.transfer_sync_write(seg, ibuf.addr, tbuf.addr, 16) == -1
        assert initiator.transfer_sync_read(seg, ibuf.addr, tbuf.addr, 16) == -1
        assert initiator.batch_transfer_sync_write(seg, [ibuf.addr], [tbuf.addr], [16]) == -1
        assert initiator.batch_transfer_async_read(seg, [ibuf.addr], [tbuf.addr], [16]) == 0
        assert initiator.transfer_submit_write(seg, ibuf.addr, tbuf.addr, 16) == 0
        assert initiator.get_first_buffer_address(seg) == 0
        assert time.monotonic() - t0 < 30, f"{seg!r}: bounded by the handshake timeouts"
    err = capfd.readouterr().err
    assert "cannot open the target segment" in err
    assert initiator._pending_batches() == 0


def test_unresolvable_peer_is_bounded(engine_pair, capfd):
    _, initiator, tbuf, ibuf = engine_pair
    t0 = time.monotonic()
    assert initiator.transfer_sync_write("no-such-host.invalid:15000", ibuf.addr, tbuf.addr, 16) == -1
    assert time.monotonic() - t0 < 30
    assert "no-such-host.invalid" in capfd.readouterr().err


def test_unregistered_local_buffer(engine_pair, capfd):
    target, initiator, tbuf, _ = engine_pair
    other = HostBuffer(4096)
    seg = segment_of(target)
    assert initiator.transfer_sync_write(seg, other.addr, tbuf.addr, 16) == -1
    assert initiator.batch_transfer_async_write(seg, [other.addr], [tbuf.addr], [16]) == 0
    assert "not inside registered memory" in capfd.readouterr().err


def test_range_not_registered_by_the_peer(engine_pair, capfd):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    assert initiator.transfer_sync_write(seg, ibuf.addr, tbuf.addr + tbuf.size - 8, 16) == -1
    assert initiator.transfer_sync_read(seg, ibuf.addr, 4096, 16) == -1
    assert "not inside any buffer registered by segment" in capfd.readouterr().err


def test_peer_registering_more_memory_later_is_seen(engine_pair):
    target, initiator, _, ibuf = engine_pair
    seg = segment_of(target)
    later = HostBuffer(4096)
    assert target.register_memory(later.addr, later.size) == 0
    ibuf.write(b"later")
    assert initiator.transfer_sync_write(seg, ibuf.addr, later.addr, 5) == 0
    assert later.read(0, 5) == b"later"


def test_async_batches_in_flight(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    ibuf.write(pattern(1 << 19, 3))
    ids = []
    blk, per = 4096, 8
    for b in range(8):
        offs = [(b * per + i) * blk for i in range(per)]
        ids.append(initiator.batch_transfer_async_write(
            seg, [ibuf.addr + o for o in offs], [tbuf.addr + o for o in offs], [blk] * per))
    assert all(ids) and len(set(ids)) == len(ids)
    assert initiator.get_batch_transfer_status(ids) == 0
    assert tbuf.read(0, 8 * per * blk) == ibuf.read(0, 8 * per * blk)
    assert initiator._pending_batches() == 0
    # every id is reported once: a second report is an error
    assert initiator.get_batch_transfer_status(ids[:1]) == -1
    rid = initiator.batch_transfer_async_read(seg, [ibuf.addr + (1 << 19)], [tbuf.addr], [blk])
    assert initiator.get_batch_transfer_status([rid]) == 0
    assert ibuf.read(1 << 19, blk) == tbuf.read(0, blk)
    rid = initiator.batch_transfer_async(seg, [ibuf.addr], [tbuf.addr], [blk], Read)
    assert initiator.get_batch_transfer_status([rid]) == 0


def test_submit_and_check_status(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    ibuf.write(pattern(65536, 9))
    b = initiator.transfer_submit_write(segment_of(target), ibuf.addr, tbuf.addr, 65536)
    assert b != 0
    deadline = time.monotonic() + 30
    while (rc := initiator.transfer_check_status(b)) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert rc == 1
    assert tbuf.read(0, 65536) == ibuf.read(0, 65536)
    assert initiator.transfer_check_status(b) == -1, "freed after it was reported"
    assert initiator._pending_batches() == 0


def test_failed_batch_and_the_rest_are_freed(engine_pair, capfd):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    doomed = HostBuffer(8192)
    assert target.register_memory(doomed.addr, doomed.size) == 0
    assert initiator.transfer_sync_write(seg, ibuf.addr, doomed.addr, 8) == 0  # descriptor cached
    assert target.unregister_memory(doomed.addr) == 0  # the initiator still believes in it
    good1 = initiator.batch_transfer_async_write(seg, [ibuf.addr], [tbuf.addr], [4096])
    bad = initiator.batch_transfer_async_write(seg, [ibuf.addr], [doomed.addr], [4096])
    good2 = initiator.batch_transfer_async_write(seg, [ibuf.addr], [tbuf.addr + 8192], [4096])
    assert good1 and bad and good2
    assert initiator.get_batch_transfer_status([good1, bad, good2]) == -1
    assert "get_batch_transfer_status: batch" in capfd.readouterr().err
    deadline = time.monotonic() + 10
    while initiator._pending_batches():
        initiator.get_batch_transfer_status([])  # frees abandoned batches once they end
        assert time.monotonic() < deadline, "batches leaked"
        time.sleep(0.01)
    bad = initiator.transfer_submit_write(seg, ibuf.addr, doomed.addr, 4096)
    deadline = time.monotonic() + 30
    while (rc := initiator.transfer_check_status(bad)) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert rc == -1
    assert initiator.transfer_sync_write(seg, ibuf.addr, doomed.addr, 16) == -1
    assert initiator._pending_batches() == 0


def test_unknown_batch_ids(engine_pair, capfd):
    _, initiator, _, _ = engine_pair
    assert initiator.get_batch_transfer_status([123456789]) == -1
    assert initiator.transfer_check_status(0) == -1
    assert initiator.get_batch_transfer_status([]) == 0
    assert capfd.readouterr().err.count("is unknown") == 2


def test_notify_round_trip(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    assert target.get_notifies() == []
    n = TransferNotify(segment_of(initiator), "kv-ready:1")
    assert initiator.transfer_sync(seg, ibuf.addr, tbuf.addr, 64, Write, n) == 0
    got = target.get_notifies()
    assert [(x.name, x.msg) for x in got] == [(segment_of(initiator), "kv-ready:1")]
    assert target.get_notifies() == [], "drained"
    assert initiator.batch_transfer_sync(seg, [ibuf.addr], [tbuf.addr], [8], Read,
                                         notify=TransferNotify("b", "batch")) == 0
    assert initiator.transfer_sync(seg, ibuf.addr, tbuf.addr, 0, Write, TransferNotify("z", "zero")) == 0
    assert [(x.name, x.msg) for x in target.get_notifies()] == [("b", "batch"), ("z", "zero")]
    # a failed transfer sends no notify
    assert initiator.transfer_sync(seg, ibuf.addr, 4096, 8, Write, TransferNotify("f", "fail")) == -1
    assert target.get_notifies() == []


def test_send_probe(engine_pair, capfd):
    target, initiator, _, _ = engine_pair
    assert initiator.send_probe(segment_of(target)) == 0
    assert initiator.send_probe(peer_server_name=segment_of(initiator)) == 0
    assert initiator.send_probe(closed_port_segment()) == -102
    assert initiator.send_probe("no-port") == -1
    assert "send_probe" in capfd.readouterr().err


def test_get_first_buffer_address(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    assert initiator.get_first_buffer_address(segment_of(target)) == tbuf.addr
    assert initiator.get_first_buffer_address(segment_of(initiator)) == ibuf.addr
    empty = make_engine()
    assert initiator.get_first_buffer_address(segment_of(empty)) == 0


def test_many_threads_one_engine(engine_pair):
    target, initiator, tbuf, ibuf = engine_pair
    seg = segment_of(target)
    ibuf.write(pattern(1 << 20, 11))
    errors = []

    def worker(t):
        for k in range(20):
            off = (t * 20 + k) * 4096
            if initiator.transfer_sync_write(seg, ibuf.addr + off, tbuf.addr + off, 4096) != 0:
                errors.append((t, k))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert tbuf.read(0, 8 * 20 * 4096) == ibuf.read(0, 8 * 20 * 4096)

