"""Times a 64 MiB tensor through the Store against the same bytes with the plain calls:
put/get of bytes, put_from/get_into of registered memory, put_tensor/get_tensor, and
put_tensor (registered tensor memory) / get_tensor_into (registered buffer). The object lives
in another process's segment (a StoreProc holder), as in serving.

    build/py-venv/bin/python tests/python/perf/tensor_round_trip.py [size_mib] [repeats] [--standin]

--standin: a store whose register_buffer takes remote_accessible=False (registering as the
plain call does), to time the temporary-registration path a local-only primitive enables.
"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from store_helpers import Master, StoreProc  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


class StandIn(MooncakeDistributedStore):
    def register_buffer(self, ptr, size, remote_accessible=True):
        return super().register_buffer(ptr, size)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    standin = "--standin" in sys.argv
    mib = int(args[0]) if args else 64
    repeats = int(args[1]) if len(args) > 1 else 5
    n = mib << 20
    master = Master(default_kv_lease_ttl=1000)
    holder = StoreProc(master, global_segment_size=4 * n + (64 << 20))
    s = StandIn() if standin else MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "",
                   master.addr) == 0
    try:
        t = torch.arange(n // 4, dtype=torch.int32)
        raw = t.numpy().tobytes()
        reg = np.zeros(n + 4096, dtype=np.uint8)
        assert s.register_buffer(reg.ctypes.data, reg.nbytes) == 0
        assert s.register_buffer(t.data_ptr(), n) == 0
        rows = []

        def put(k, f):
            def run():
                s.remove(k, True)
                assert f() == 0
            return run

        rows.append(("put(bytes) / get -> bytes",
                     best(put("b", lambda: s.put("b", raw)), repeats),
                     best(lambda: s.get("b"), repeats)))
        reg[:n] = np.frombuffer(raw, dtype=np.uint8)
        rows.append(("put_from / get_into (registered)",
                     best(put("r", lambda: s.put_from("r", reg.ctypes.data, n)), repeats),
                     best(lambda: s.get_into("r", reg.ctypes.data, reg.nbytes), repeats)))
        t2 = t.clone()  # not registered
        rows.append(("put_tensor / get_tensor",
                     best(put("t", lambda: s.put_tensor("t", t2)), repeats),
                     best(lambda: s.get_tensor("t"), repeats)))
        rows.append(("put_tensor (registered) / get_tensor_into (registered)",
                     best(put("u", lambda: s.put_tensor("u", t)), repeats),
                     best(lambda: s.get_tensor_into("u", reg.ctypes.data, reg.nbytes),
                          repeats)))
        assert torch.equal(s.get_tensor("t"), t)
        assert torch.equal(s.get_tensor_into("u", reg.ctypes.data, reg.nbytes), t)
        print(f"{mib} MiB, best of {repeats}{' (stand-in)' if standin else ''}; "
              "put / get in ms (GB/s)")
        for name, p, g in rows:
            print(f"  {name:55s} {p * 1e3:7.1f} ({n / p / 1e9:5.2f})  "
                  f"{g * 1e3:7.1f} ({n / g / 1e9:5.2f})")
        s.unregister_buffer(t.data_ptr())
        s.unregister_buffer(reg.ctypes.data)
    finally:
        s.close()
        holder.close()
        master.stop()


if __name__ == "__main__":
    main()
