"""Upstream's smaller Store calls: put_from_with_metadata (one object: the metadata's bytes,
then the data's, moved from where they are) against a real master with the object held by
another process, and bind_to_numa_node (the thread's CPUs and memory preference)."""
import os

import pytest

from store_helpers import buf, ptr, store_fixtures

np = pytest.importorskip("numpy")

master, holder, store = store_fixtures(lease_ms=500, holder_segment=32 << 20)


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "staged"])
def test_put_from_with_metadata_is_metadata_then_data(store, holder, registered):
    data = buf(3 << 20, seed=7)
    meta = np.array([42, 100, 7], dtype=np.int32)
    if registered:
        assert store.register_buffer(ptr(data), data.nbytes) == 0
        assert store.register_buffer(ptr(meta), meta.nbytes) == 0
    try:
        assert store.put_from_with_metadata("wm", ptr(data), ptr(meta), data.nbytes,
                                            meta.nbytes) == 0
        assert store.get_size("wm") == data.nbytes + meta.nbytes
        got = holder.call("result = store.get('wm')")
        assert got == meta.tobytes() + data.tobytes()
        # Another put of an existing key answers 0 and keeps the first value (upstream's puts
        # do so); no metadata is a plain put.
        assert store.put_from_with_metadata("wm", ptr(meta), ptr(data), meta.nbytes,
                                            data.nbytes) == 0
        assert holder.call("result = store.get('wm')") == meta.tobytes() + data.tobytes()
        assert store.put_from_with_metadata("plain", ptr(data), 0, 4096, 0) == 0
        assert store.get("plain") == data.tobytes()[:4096]
        # Nothing to store is an error, not a silent 0.
        assert store.put_from_with_metadata("empty", ptr(data), ptr(meta), 0, meta.nbytes) == -600
        assert store.is_exist("empty") == 0
    finally:
        if registered:
            assert store.unregister_buffer(ptr(data)) == 0
            assert store.unregister_buffer(ptr(meta)) == 0


def node_cpus(node):
    path = f"/sys/devices/system/node/node{node}/cpulist"
    if not os.path.exists(path):
        return None
    cpus = set()
    for part in open(path).read().strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_bind_to_numa_node():
    from mooncake.store import bind_to_numa_node
    before = os.sched_getaffinity(0)
    try:
        cpus = node_cpus(0)
        if cpus is None:
            assert bind_to_numa_node(0) is None  # no NUMA here: a warning, nothing changed
            assert os.sched_getaffinity(0) == before
        else:
            assert bind_to_numa_node(0) is None
            assert os.sched_getaffinity(0) == cpus
        # A node that does not exist: a warning, the binding as it was.
        now = os.sched_getaffinity(0)
        assert bind_to_numa_node(4095) is None
        assert bind_to_numa_node(-1) is None
        assert os.sched_getaffinity(0) == now
    finally:
        os.sched_setaffinity(0, before)
