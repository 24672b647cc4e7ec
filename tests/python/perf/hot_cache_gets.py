"""Repeated gets of another client's objects over TCP, without and with the local hot cache
(MC_STORE_LOCAL_HOT_CACHE_SIZE): the objects live in a holder process's segment; two clients in
this process read them with batch_get_into into registered memory, one plain, one with a cache
big enough for them (after one warm-up pass). Same host, MC_FORCE_TCP=1 (the cache is for
remote reads; same-host reads are a memcpy already).

    build/py-venv/bin/python tests/python/perf/hot_cache_gets.py [seconds per case]
"""
import os
import pathlib
import sys
import time

os.environ["MC_FORCE_TCP"] = "1"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402

from store_helpers import Master, StoreProc  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402

CASES = [(4 << 10, 128, 1024), (64 << 10, 64, 256), (1 << 20, 16, 64)]  # size, batch, objects


def client(master, cache_bytes):
    if cache_bytes:
        os.environ["MC_STORE_LOCAL_HOT_CACHE_SIZE"] = str(cache_bytes)
        os.environ["MC_STORE_LOCAL_HOT_BLOCK_SIZE"] = str(1 << 20)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", master.addr) == 0
    os.environ.pop("MC_STORE_LOCAL_HOT_CACHE_SIZE", None)
    os.environ.pop("MC_STORE_LOCAL_HOT_BLOCK_SIZE", None)
    return s


def rate(store, keys, size, batch, seconds):
    buf = np.zeros(size * batch, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    ptrs = [buf.ctypes.data + i * size for i in range(batch)]
    sizes = [size] * batch
    groups = [keys[i:i + batch] for i in range(0, len(keys), batch)]
    for g in groups:  # warm-up: connections, and the cache's fill
        assert store.batch_get_into(g, ptrs, sizes) == sizes
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for g in groups:
            got = store.batch_get_into(g, ptrs, sizes)
            assert got == sizes, got
            done += len(g)
    elapsed = time.perf_counter() - t0
    store.unregister_buffer(buf.ctypes.data)
    return done / elapsed, done * size / elapsed / 1e9


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3
    master = Master(default_kv_lease_ttl=1000)
    holder = StoreProc(master, global_segment_size=256 << 20, env={"MC_FORCE_TCP": "1"})
    plain = client(master, 0)
    cached = client(master, 128 << 20)
    try:
        print(f"same host over TCP, batch_get_into, {seconds:.0f} s per case")
        print("| objects | plain gets/s (GB/s) | hot cache gets/s (GB/s) | speed-up |")
        print("|---|---|---|---|")
        for size, batch, count in CASES:
            keys = [f"hc/{size}/{i}" for i in range(count)]
            value = np.random.default_rng(size).bytes(size)
            for k in keys:
                assert plain.put(k, value) == 0
            p, pg = rate(plain, keys, size, batch, seconds)
            c, cg = rate(cached, keys, size, batch, seconds)
            print(f"| {size >> 10} KiB x {batch} (of {count}) | {p:,.0f} ({pg:.2f}) | "
                  f"{c:,.0f} ({cg:.2f}) | {c / p:.1f}x |")
            plain.batch_remove(keys, True)
    finally:
        plain.close()
        cached.close()
        holder.close()
        master.stop()


if __name__ == "__main__":
    main()
