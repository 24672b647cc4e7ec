"""mooncake.BufferPool / RegisteredBufferPool: leases of registered memory for zero-copy Store
I/O, with upstream's constructor, acquire/release, bounds and error messages."""
import gc
import threading
import time

import pytest

from store_helpers import lending_store_fixtures

import mooncake
from mooncake.buffer_pool import BufferPool, RegisteredBufferPool
from mooncake.store import MooncakeDistributedStore

np = pytest.importorskip("numpy")
LOCAL = 4 << 20


master, store, _ = lending_store_fixtures(1000, 64 << 20, LOCAL, clean=False)


def test_names():
    assert mooncake.BufferPool is BufferPool is RegisteredBufferPool
    from mooncake.store import BufferPool as FromStore
    assert FromStore is BufferPool


def test_lease_is_registered_memory_for_zero_copy_io(store):
    pool = BufferPool(store, min_size_class=4096, alignment=4096)
    payload = np.random.default_rng(1).bytes(300_000)
    with pool.acquire(len(payload)) as lease:
        assert lease.size == len(payload) and lease.ptr % 4096 == 0
        view = lease.buffer
        view[:] = payload
        del view
        # registered: registering it again is refused as an overlap
        assert store.register_buffer(lease.ptr, lease.size) != 0
        assert store.put_from("bp", lease.ptr, lease.size) == 0
    with pool.acquire(len(payload)) as lease2:
        assert store.get_into("bp", lease2.ptr, lease2.size) == len(payload)
        assert bytes(lease2.buffer) == payload
    pool.close()
    store.remove("bp", force=True)


def test_released_region_is_reused(store):
    pool = BufferPool(store, min_size_class=4096, alignment=4096)
    a = pool.acquire(5000)
    p = a.ptr
    a.release()
    b = pool.acquire(8000)   # same size class (8 KiB): the cached region again
    assert b.ptr == p
    b.release()
    pool.close()


def test_overflow_past_local_buffer_and_capacity(store):
    pool = BufferPool(store)  # max_bytes: twice the local buffer
    big = pool.acquire(LOCAL)
    small = pool.acquire(1024, block=False)
    assert small.size == 1024
    with pytest.raises(RuntimeError, match="capacity"):
        pool.acquire(3 * LOCAL)
    with pytest.raises(RuntimeError, match="overflow|capacity"):
        pool.acquire((1 << 64) - 1)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(LOCAL, block=False)   # 4 + 4 MiB taken of 8
    small.release()
    big.release()
    again = pool.acquire(2 * LOCAL - (64 << 10), block=False)  # idle regions make room
    again.release()
    pool.close()


@pytest.mark.parametrize("size", [0, 1, 128 * 1024 + 1])
def test_any_size(store, size):
    pool = BufferPool(store, 1 << 20, max_size_class=128 * 1024, alignment=4096)
    lease = pool.acquire(size)
    assert lease.size == size and len(lease.buffer) == size
    lease.release()
    pool.close()


def test_bad_arguments(store):
    with pytest.raises(RuntimeError, match="alignment"):
        BufferPool(store, 1 << 20, alignment=12345)
    with pytest.raises(RuntimeError, match="alignment"):
        BufferPool(store, 1 << 20, alignment=4)
    with pytest.raises(RuntimeError, match="positive"):
        BufferPool(store, 1 << 20, min_size_class=0)
    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(MooncakeDistributedStore())
    pool = BufferPool(store, 1 << 20, alignment=4096)
    with pytest.raises(RuntimeError, match="timeout"):
        pool.acquire(1, timeout=-1)
    pool.close()


def test_max_regions_blocks_times_out_and_wakes(store):
    pool = BufferPool(store, min_size_class=4096, max_size_class=4096, alignment=4096,
                      max_regions=1)
    lease = pool.acquire(1)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(1, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 5
    got = []
    th = threading.Thread(target=lambda: got.append(pool.acquire(1)))
    th.start()
    time.sleep(0.1)
    assert th.is_alive()        # blocked, and not holding the GIL: this thread runs
    lease.release()
    th.join(5)
    assert not th.is_alive() and got[0].size == 1
    got[0].release()
    pool.close()


def test_views_keep_lease_and_close_checks(store):
    pool = BufferPool(store, 4096, min_size_class=4096, alignment=4096)
    lease = pool.acquire(4)
    view = lease.buffer
    view[:] = b"test"
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del view
    gc.collect()
    lease.release()
    lease.release()  # twice: nothing
    with pytest.raises(RuntimeError, match="closed"):
        _ = lease.ptr
    dropped = pool.acquire(1)
    del dropped          # given back when collected
    gc.collect()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)


def test_prewarm_registers_ahead(store):
    pool = BufferPool(store, 1 << 20, min_size_class=4096, alignment=4096,
                      prewarm_size=1024, prewarm_count=2)
    a, b = pool.acquire(1024), pool.acquire(1024)
    assert a.ptr != b.ptr
    a.release()
    b.release()
    pool.close()


def test_threads(store):
    pool = BufferPool(store, 1 << 20, min_size_class=4096, alignment=4096, max_regions=4)
    errors = []

    def work(i):
        try:
            for r in range(50):
                with pool.acquire(1000 + 37 * r, timeout=10) as lease:
                    v = lease.buffer
                    v[:4] = i.to_bytes(4, "little")
                    assert bytes(v[:4]) == i.to_bytes(4, "little")
                    del v
        except Exception as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors
    pool.close()
