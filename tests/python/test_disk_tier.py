"""The disk tier (src/store/disk/README.md) through the Python API, against a real
mooncake_master with --enable_offload: a holder in another process lends a small DRAM segment
and offloads to its own directory; a client lending nothing puts four times the segment; every
object reads back byte-exact, most of them from the holder's disk through its offload service;
get_replica_desc says where; the holder restarted on the same directory serves them again;
after kill -9 of the holder, gets fail cleanly once its TTL has passed; a removal reaches the
disk; unmount_local_disk_segment stops readers being sent there."""
import os
import tempfile
import time

import pytest

from store_helpers import Master, StoreProc, new_store, wait_until

SEG = 16 << 20
OBJ = 1 << 20
N = 4 * SEG // OBJ  # four times the holder's DRAM
ENV = {"MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES": str(64 << 20)}


def value(i, n=OBJ):
    return bytes((i * 7 + j) & 0xFF for j in range(256)) * (n // 256) + bytes(n % 256)


@pytest.fixture(scope="module", name="master")
def master_fixture():
    m = Master(enable_offload="true", default_kv_lease_ttl=300, client_ttl=2)
    yield m
    m.stop()


def holder_on(master, path):
    h = StoreProc(master, setup=False, env=ENV)
    rc = h.call("result = store.setup('127.0.0.1', 'P2PHANDSHAKE', gseg, lbuf, 'tcp', '', addr, "
                "enable_ssd_offload=True, ssd_offload_path=path)",
                gseg=SEG, lbuf=16 << 20, addr=master.addr, path=path)
    assert rc == 0, rc
    return h


def put_all(store, keys, n=OBJ):
    """Puts every key; a full pool whose objects still wait for the disk answers -200 (no
    space now): wait and retry, as a writer does."""
    for i, k in enumerate(keys):
        deadline = time.time() + 30
        while True:
            rc = store.put(k, value(i, n))
            if rc == 0:
                break
            assert rc == -200 and time.time() < deadline, (k, rc)
            time.sleep(0.05)


def test_four_times_dram_reads_back_byte_exact_and_survives_a_holder_restart(master):
    with tempfile.TemporaryDirectory() as d:
        holder = holder_on(master, d)
        store = new_store(master)
        keys = [f"fill{i}" for i in range(N)]
        try:
            put_all(store, keys)
            for i, k in enumerate(keys):
                assert store.get(k) == value(i), k
            assert store.get_offload_rpc_read_count() >= N // 2
            # The first objects left memory: their only replica is the holder's disk.
            desc = store.get_replica_desc(keys[0])
            assert desc and all(r.is_local_disk_replica() for r in desc)
            assert not desc[0].is_memory_replica()
            assert desc[0].get_disk_descriptor().object_size == OBJ
            # Bucket files in the directory, with a store id and a removal log.
            names = os.listdir(d)
            assert any(n.endswith(".bucket") for n in names), names
            assert ".mooncake_offload.id" in names
            # The holder restarts on the same directory (within its TTL): what waited for its
            # disk was written at close; every object is registered again and served from it.
            holder.close()
            holder = holder_on(master, d)
            for i, k in enumerate(keys):
                assert store.get(k) == value(i), k
            # A removal reaches the holder's disk.
            assert store.remove(keys[0]) == 0
            assert store.get(keys[0]) == b""
            wait_until(lambda: holder.call(
                "result = store.get_replica_desc(k)", k=keys[0]) == [], 10,
                what="the removal")
        finally:
            store.remove_all(force=True)
            store.close()
            holder.close()


def test_a_killed_holders_disk_is_no_longer_served_and_gets_fail_promptly(master):
    with tempfile.TemporaryDirectory() as d:
        holder = holder_on(master, d)
        store = new_store(master)
        try:
            put_all(store, [f"k{i}" for i in range(N)])
            assert store.get("k0") == value(0)  # from the disk
            holder.kill()
            # Until the master drops it (client_ttl 2 s), a get of a disk-only key fails at
            # the holder's gone service; after, the key is gone. Never a hang, never bytes.
            for _ in range(2):
                t = time.time()
                assert store.get("k0") == b""
                assert time.time() - t < 15
            wait_until(lambda: store.is_exist("k0") == 0, 10, what="the holder's TTL")
        finally:
            store.remove_all(force=True)
            store.close()
            holder.close()


def test_unmount_local_disk_segment(master):
    with tempfile.TemporaryDirectory() as d:
        holder = holder_on(master, d)
        store = new_store(master)
        try:
            put_all(store, [f"u{i}" for i in range(N)])
            assert store.is_exist("u0") == 1
            assert holder.call("result = store.unmount_local_disk_segment()") == 0
            assert store.is_exist("u0") == 0  # its only replica was on the disk
            assert store.unmount_local_disk_segment() == -600  # this client has no disk
        finally:
            store.remove_all(force=True)
            store.close()
            holder.close()
