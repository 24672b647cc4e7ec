"""Times a DataProto of SIZE MiB (default 1024) through mooncake.structured_object_store against
the engine's own path for the same bytes: batch_put_from / batch_get_into of 64 MiB chunks from
and into registered memory. The objects live in another process's segment (a StoreProc holder),
as in serving; same host, so the shm transport.

    build/py-venv/bin/python tests/python/perf/dataproto_round_trip.py [size_mib] [repeats]

The DataProto: batch {"tokens": torch int64 [rows, 512], "logits": numpy float32 [rows, 1024]}
(half the bytes each), non_tensor_batch {"uid": a str per row}, meta_info {"step": 1}. Printed:
best-of-N milliseconds and GB/s per step, and each as a share of the engine path's rate.
"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from store_helpers import Master, StoreProc  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402
from mooncake.structured_object_store import MooncakeBundleTransfer  # noqa: E402

CHUNK = 64 << 20


def best(fn, repeats, before=None):
    times = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    n = mib << 20
    master = Master(default_kv_lease_ttl=1000)
    holder = StoreProc(master, global_segment_size=2 * n + (256 << 20))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", master.addr) == 0
    try:
        rows = n // (2 * 4096)
        tokens = torch.arange(rows * 512, dtype=torch.int64).reshape(rows, 512)
        logits = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
        data = {"batch": {"tokens": tokens, "logits": logits},
                "non_tensor_batch": {"uid": np.asarray([f"u{i}" for i in range(rows)],
                                                       dtype=object)},
                "meta_info": {"step": 1}}
        nbytes = tokens.numel() * 8 + logits.nbytes

        src = np.zeros(n, dtype=np.uint8)
        src[:] = 7
        dst = np.zeros(n, dtype=np.uint8)
        assert s.register_buffer(src.ctypes.data, n) == 0
        assert s.register_buffer(dst.ctypes.data, n) == 0
        keys = [f"raw/{i}" for i in range(n // CHUNK)]
        ptrs = [src.ctypes.data + i * CHUNK for i in range(len(keys))]
        dptrs = [dst.ctypes.data + i * CHUNK for i in range(len(keys))]
        sizes = [CHUNK] * len(keys)

        def clear_raw():
            s.batch_remove(keys, True)
            time.sleep(1.1)  # the readers' leases (1 s) lapse before the space is reused

        raw_put = best(lambda: assert_ok(s.batch_put_from(keys, ptrs, sizes)), repeats, clear_raw)
        raw_get = best(lambda: assert_sizes(s.batch_get_into(keys, dptrs, sizes), sizes), repeats)
        assert (dst == 7).all()
        clear_raw()

        t = MooncakeBundleTransfer(s, key_prefix="bench")
        refs = []

        def put():
            refs.append(t.put_dataproto(data, stage="rollout"))

        def cleanup():
            while refs:
                t.cleanup_dataproto(refs.pop())
            time.sleep(1.1)

        dp_put = best(put, repeats, cleanup)
        out = {}

        def get():
            out["r"] = t.get_dataproto(refs[-1])

        dp_get = best(get, repeats, out.clear)  # the last result freed first, as a consumer would
        r = out["r"]
        assert torch.equal(r["batch"]["tokens"], tokens)
        assert np.array_equal(r["batch"]["logits"], logits)
        assert r["non_tensor_batch"]["uid"][rows - 1] == f"u{rows - 1}"
        half = slice(rows // 4, rows // 4 + rows // 2)
        dp_rows = best(lambda: out.update(h=t.get_dataproto(refs[-1], rows=half)), repeats,
                       out.clear)
        assert np.array_equal(out["h"]["batch"]["logits"], logits[half])
        # Into the caller's memory (a trainer's reused buffers): no page of it is new.
        dest = {"tokens": torch.empty_like(tokens), "logits": np.empty_like(logits)}
        dp_into = best(lambda: t.get_dataproto(refs[-1], batch_fields=["tokens", "logits"],
                                               destinations=dest), repeats)
        assert torch.equal(dest["tokens"], tokens) and np.array_equal(dest["logits"], logits)
        cleanup()

        print(f"DataProto of {nbytes / 2**20:.0f} MiB (+ {rows} str rows), best of {repeats}, "
              f"ms (GB/s, share of the engine path)")
        print("| step | ms | GB/s | share |")
        print("|---|---|---|---|")
        for name, sec, size, base in [
                ("engine: batch_put_from, 64 MiB chunks", raw_put, n, raw_put * nbytes / n),
                ("engine: batch_get_into, 64 MiB chunks", raw_get, n, raw_get * nbytes / n),
                ("put_dataproto", dp_put, nbytes, raw_put * nbytes / n),
                ("get_dataproto (all rows)", dp_get, nbytes, raw_get * nbytes / n),
                ("get_dataproto (half the rows)", dp_rows, nbytes / 2, raw_get * nbytes / 2 / n),
                ("get_dataproto into destinations (batch fields)", dp_into, nbytes,
                 raw_get * nbytes / n)]:
            print(f"| {name} | {sec * 1e3:.0f} | {size / sec / 1e9:.2f} | {base / sec:.2f} |")
    finally:
        s.close()
        holder.close()
        master.stop()


def assert_ok(codes):
    assert all(c == 0 for c in codes), codes


def assert_sizes(got, want):
    assert list(got) == list(want), got


if __name__ == "__main__":
    main()
