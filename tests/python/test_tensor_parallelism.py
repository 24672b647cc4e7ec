"""The `*_with_parallelism` tensor family against upstream Mooncake.

fixtures/upstream_parallel/ holds what upstream's client (mooncake-transfer-engine-non-cuda
0.3.13.post1, with its own mooncake_master) stored and read back for the scenarios of
parallel_cases.py; regenerate it with fixtures/regen_upstream_parallel.sh. This package must
store the same bytes under the same keys and read the same tensors back.
"""
import ctypes
import pathlib
import types

import pytest

from mc_helpers import require_torch
from store_helpers import Master, lending_store_fixtures

import parallel_cases
import mooncake.store as mod
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "upstream_parallel"
P = parallel_cases


@pytest.fixture(scope="module")
def torch():
    return require_torch()


master, store, _clean = lending_store_fixtures(1000, 256 << 20, 32 << 20)


def same(torch, a, b):
    return (a is not None and b is not None and a.dtype == b.dtype and
            tuple(a.shape) == tuple(b.shape) and
            a.contiguous().reshape(-1).view(torch.uint8).tolist() ==
            b.contiguous().reshape(-1).view(torch.uint8).tolist())


def recorded_reads(torch):
    out = {}
    for line in (FIXTURES / "reads.txt").read_text().splitlines():
        scenario, name, *rest = line.split()
        if rest == ["None"]:
            out[(scenario, name)] = None
            continue
        dtype, shape = getattr(torch, rest[0]), tuple(int(d) for d in rest[1].split(","))
        raw = (FIXTURES / f"{scenario}.read.{name}.bin").read_bytes()
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
            torch.empty(0, dtype=torch.uint8)
        out[(scenario, name)] = flat.view(dtype).reshape(shape)
    return out


def tp(rank, size, split_dim):
    return P.par(mod, P.axis(mod, "tp", rank, size, split_dim))


# ---- byte compatibility with upstream ----

def test_fixtures_were_recorded_with_upstream():
    assert "0.3.13" in (FIXTURES / "VERSION").read_text()


@pytest.mark.parametrize("scenario", list(P.OBJECTS))
def test_scenario_matches_upstream(torch, store, scenario):
    objects, reads = P.run(store, mod, torch, scenario, "par_" + scenario)
    for suffix, raw in objects.items():
        assert raw == (FIXTURES / f"{scenario}{suffix}.bin").read_bytes(), suffix
    expected = {n: t for (s, n), t in recorded_reads(torch).items() if s == scenario}
    assert set(reads) == set(expected)
    for name, t in expected.items():
        if t is None:
            assert reads[name] is None, name
        else:
            assert same(torch, reads[name], t), name


@pytest.mark.parametrize("scenario", list(P.OBJECTS))
def test_reads_upstream_objects(torch, store, scenario):
    """Objects written by upstream's client read back here as upstream read them."""
    base = "up_" + scenario
    for suffix in P.OBJECTS[scenario]:
        assert store.put(base + suffix, (FIXTURES / f"{scenario}{suffix}.bin").read_bytes()) == 0
    if scenario == "tp_shards":
        want = recorded_reads(torch)
        for size, rank in ((4, 1), (3, 2), (2, 1)):
            got = store.get_tensor_with_parallelism(
                base, P.target(mod, "shard", tp(rank, size, 1)))
            assert same(torch, got, want[("tp_shards", f"tp{size}_rank{rank}")])
        got = store.get_tensor_with_parallelism(base, P.target(mod, "full", tp(0, 2, 1)))
        assert same(torch, got, want[("tp_shards", "full")])


# ---- the default (no parallelism) paths, as upstream's test_dummy_client expects ----

def test_default_paths_are_the_plain_tensor_calls(torch, store):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert store.put_tensor_with_parallelism("d1", t) == 0
    assert same(torch, store.get_tensor("d1"), t)
    assert store.get_tensor_with_parallelism("d1") is not None
    assert list(store.batch_put_tensor_with_parallelism(["d2", "d3"], [t + 1, t + 2])) == [0, 0]
    got = store.batch_get_tensor_with_parallelism(["d2", "d3"])
    assert same(torch, got[0], t + 1) and same(torch, got[1], t + 2)
    buf, ptr, size = P.serialized(mod, t)
    assert store.put_tensor_with_parallelism_from("d4", ptr, size) == 0
    assert same(torch, store.get_tensor("d4"), t)
    assert store.upsert_tensor_with_parallelism("d1", t + 6) == 0
    assert same(torch, store.get_tensor("d1"), t + 6)
    assert list(store.batch_upsert_tensor_with_parallelism_from(["d4"], [ptr], [size])) == [0]
    assert list(store.batch_upsert_tensor_with_parallelism(["d5"], [t])) == [0]
    assert store.upsert_tensor_with_parallelism_from("d5", ptr, size) == 0
    assert list(store.batch_put_tensor_with_parallelism_from(["d6"], [ptr], [size])) == [0]
    assert same(torch, store.get_tensor("d6"), t)
    assert store.put_tensor_with_parallelism("d7", t, config=ReplicateConfig()) == 0


def test_batch_with_per_key_parallelism_and_none_items(torch, store):
    t = torch.arange(8, dtype=torch.int16).reshape(2, 4)
    rc = store.batch_put_tensor_with_parallelism(["b1", "b2"], [t, t], [tp(1, 2, 1), None])
    assert list(rc) == [0, 0]
    assert same(torch, store.get_tensor("b1_tp_1"), t)   # t is rank 1's own shard
    assert same(torch, store.get_tensor("b2"), t)
    full = store.get_tensor_with_parallelism("b1", P.target(mod, "full", tp(0, 2, 1)))
    assert full is None  # rank 0's shard is missing


def test_into_forms(torch, store):
    t = torch.arange(24, dtype=torch.float64).reshape(2, 12)
    for r in range(2):
        assert store.put_tensor_with_parallelism("i", t.narrow(1, 6 * r, 6).contiguous(),
                                                 tp(r, 2, 1)) == 0
    buf = ctypes.create_string_buffer(4096)
    got = store.get_tensor_with_parallelism_into(
        "i", ctypes.addressof(buf), 4096, P.target(mod, "shard", tp(1, 3, 1)))
    assert same(torch, got, t.narrow(1, 4, 4))
    # the buffer now holds a tensor object put_tensor_from accepts
    assert store.put_tensor_from("i_copy", ctypes.addressof(buf), 304 + 64) == 0
    assert same(torch, store.get_tensor("i_copy"), t.narrow(1, 4, 4))
    got = store.batch_get_tensor_with_parallelism_into(
        ["i", "i_tp_0"], [ctypes.addressof(buf), ctypes.addressof(buf) + 2048], [2048, 2048],
        [P.target(mod, "full", tp(0, 1, 1)), None])
    assert same(torch, got[0], t) and same(torch, got[1], t.narrow(1, 0, 6))
    assert store.get_tensor_with_parallelism_into(
        "i", ctypes.addressof(buf), 400, P.target(mod, "full", tp(0, 1, 1))) is None


# ---- bad requests: -600 or None, never an exception ----

def test_bad_write_requests(torch, store):
    t = torch.zeros(4, 4)
    w = types.SimpleNamespace(rank=0, size=2, split_dim=0)
    bad = [
        dict(parallelism=tp(0, 2, 0), writer_partition=w),         # both
        dict(parallelism=P.par(mod)),                              # no axes
        dict(parallelism=tp(2, 2, 0)),                             # rank >= size
        dict(parallelism=tp(0, 2, None)),                          # TP without split_dim
        dict(parallelism=tp(0, 2, 5)),                             # split_dim out of range
        dict(parallelism=P.par(mod, P.axis(mod, "xx", 0, 1))),     # unknown kind
        dict(parallelism=P.par(mod, P.axis(mod, "dp", 0, 2, 0))),  # DP with split_dim
        dict(parallelism=P.par(mod, P.axis(mod, "ep", 0, 2))),     # EP without expert_id
        dict(parallelism=P.par(mod, P.axis(mod, "tp", 0, 2, 0), P.axis(mod, "TP", 1, 2, 0))),
        dict(parallelism=P.par(mod, P.axis(mod, "tp", 0, 3, 0), P.axis(mod, "dp", 0, 1))),
        dict(parallelism=object()),
        dict(writer_partition=types.SimpleNamespace(rank=0, size=3, split_dim=0)),
        dict(writer_partition=types.SimpleNamespace(rank=0, size=2)),
    ]
    for kw in bad:
        assert store.put_tensor_with_parallelism("x", t, **kw) == -600, kw
        assert store.upsert_tensor_with_parallelism("x", t, **kw) == -600, kw
    assert store.put_tensor_with_parallelism("x", "not a tensor", tp(0, 2, 0)) == -600
    assert store.put_tensor_with_parallelism_from("x", 0, 10) == -600
    assert store.put_tensor_with_parallelism_from("x", 0, 10, tp(0, 2, 0)) == -600
    assert list(store.batch_put_tensor_with_parallelism(["a", "b"], [t])) == [-600, -600]
    assert list(store.batch_put_tensor_with_parallelism(["a"], [t], [tp(0, 2, 0)] * 2)) == \
        [-600]
    assert list(store.batch_put_tensor_with_parallelism(
        ["a"], [t], [tp(0, 2, 0)], writer_partitions=[w])) == [-600]
    assert store.batch_put_tensor_with_parallelism([], []) == []
    assert not store.is_exist("x") and not store.is_exist("a")


def test_bad_read_requests(torch, store):
    assert store.put_tensor_with_parallelism("r", torch.ones(2, 2), tp(0, 2, 0)) == 0
    assert store.get_tensor_with_parallelism("r", object()) is None
    assert store.get_tensor_with_parallelism("r", P.target(mod, "shard")) is None
    assert store.get_tensor_with_parallelism(
        "r", P.target(mod, "as_stored", tp(0, 2, 0))) is None
    assert store.get_tensor_with_parallelism(
        "r", P.target(mod, "full", P.par(mod, P.axis(mod, "dp", 0, 2)))) is None
    assert store.get_tensor_with_parallelism("r", P.target(mod, "full", tp(0, 2, 0))) is None
    assert store.get_tensor_with_parallelism("missing", P.target(mod, "full")) is None
    assert store.batch_get_tensor_with_parallelism(["r", "s"], [None]) == [None, None]
    assert store.batch_get_tensor_with_parallelism_into(["r"], [1, 2], [3]) == [None]
    with pytest.raises(RuntimeError):
        mod.ReadTarget().mode = "sideways"


def test_corrupt_shard_is_refused(torch, store):
    t = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    for r in range(2):
        assert store.put_tensor_with_parallelism("c", t.narrow(1, 2 * r, 2).contiguous(),
                                                 tp(r, 2, 1)) == 0
    # rank 1's object replaced by a shard that names another TP size
    assert store.upsert_tensor_with_tp("c", torch.zeros(2, 6), tp_size=3, split_dim=1) == 0
    assert store.get_tensor_with_parallelism("c", P.target(mod, "full", tp(0, 2, 1))) is None


# ---- TP ranks in separate processes (dummy clients of one real client) ----

def test_ranks_in_dummy_processes_write_and_reshard(torch):
    from test_store_dummy import RealClient, dummy
    t = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    prelude = ("import torch, mooncake.store as mod\n"
               "def tp(r, n): return mod.TensorParallelism([mod.ParallelAxis('tp', r, n, 1)])\n"
               "t = torch.arange(24, dtype=torch.float32).reshape(2, 12)\n")
    with Master() as m:
        real = RealClient(m)
        procs = []
        try:
            procs = [dummy(real), dummy(real)]
            for r, p in enumerate(procs):
                p.call(prelude + "result = 0")
                assert p.call("result = store.put_tensor_with_parallelism("
                              "'w', t.narrow(1, 6 * r, 6).contiguous(), tp(r, 2))", r=r) == 0
            got = procs[0].call("result = store.get_tensor_with_parallelism("
                                "'w', mod.ReadTarget('shard', tp(1, 3))).tolist()")
            assert got == t.narrow(1, 4, 4).tolist()
            got = procs[1].call("result = store.get_tensor_with_parallelism("
                                "'w', mod.ReadTarget('full', tp(0, 4))).tolist()")
            assert got == t.tolist()
        finally:
            for p in procs:
                p.close()
            real.stop()


def test_index_like_ranks_are_ints(torch, store):
    np = pytest.importorskip("numpy")
    a = P.axis(mod, "tp", np.int64(1), np.int32(2), np.int64(0))
    assert store.put_tensor_with_parallelism("n", torch.ones(2, 2), P.par(mod, a)) == 0
    assert store.is_exist("n_tp_1") == 1
    bad = P.axis(mod, "tp", True, 2, 0)
    assert store.put_tensor_with_parallelism("n", torch.ones(2, 2), P.par(mod, bad)) == -600
