"""The `*_with_parallelism` scenarios of the fixtures under fixtures/upstream_parallel/: each
one writes deterministic tensors through one store (upstream's client when recording, this
package's in the tests) and reads some back, so that the recorder and the tests run the same
calls and compare what the Store holds and what the reads return.

run(store, mod, torch, name, base) -> (objects, reads): objects maps a key suffix (the key minus
base) to the raw bytes under it; reads maps a read's name to the tensor it returned (or
None). `mod` is the mooncake.store module (for ParallelAxis, TensorParallelism, ReadTarget).
"""
import ctypes
import types


def axis(mod, kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = mod.ParallelAxis()  # upstream's class takes no constructor arguments
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def par(mod, *axes):
    p = mod.TensorParallelism()
    p.axes = list(axes)
    return p


def tp(mod, rank, size, split_dim):
    return par(mod, axis(mod, "tp", rank, size, split_dim))


def target(mod, mode, parallelism=None):
    t = mod.ReadTarget()
    t.mode = mode
    t.parallelism = parallelism
    return t


def full(torch, shape, dtype):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) * 1.5 - 7).to(dtype).reshape(shape)


def serialized(mod, tensor):
    """(ctypes buffer, address, size) of a tensor object [metadata][data]."""
    meta, ptr, size, _ = mod._serialize_tensor(tensor)
    buf = ctypes.create_string_buffer(len(meta) + size)
    ctypes.memmove(buf, meta, len(meta))
    ctypes.memmove(ctypes.addressof(buf) + len(meta), ptr, size)
    return buf, ctypes.addressof(buf), len(meta) + size


# scenario name -> key suffixes it must leave in the Store
OBJECTS = {
    "tp_shards": ["_tp_0", "_tp_1", "__parallelism_manifest"],
    "pp_tp": ["__tp_1of2_sd0__pp_0of2_sid1", "__parallelism_manifest"],
    "ep": ["__ep_1of4_eid5"],
    "dp_tp_from": ["__dp_0of2__tp_0of2_sd0", "__dp_0of2__tp_1of2_sd0"],
    "writer": ["__writer_1of2_sd0", "__writer_manifest"],
    "tp_from": ["_tp_0", "_tp_1", "_tp_2"],
}


def run(store, mod, torch, name, base):
    objects, reads = {}, {}
    if name == "tp_shards":
        t = full(torch, (2, 12), torch.float32)
        for r in range(2):
            rc = store.put_tensor_with_parallelism(base, t.narrow(1, 6 * r, 6).contiguous(),
                                                   par(mod, axis(mod, "tp", r, 2, 1)))
            assert rc == 0, rc
        for size, rank in ((4, 0), (4, 1), (4, 2), (4, 3), (3, 2), (2, 1), (1, 0), (5, 0)):
            reads[f"tp{size}_rank{rank}"] = store.get_tensor_with_parallelism(
                base, target(mod, "shard", par(mod, axis(mod, "tp", rank, size, 1))))
        reads["full"] = store.get_tensor_with_parallelism(
            base, target(mod, "full", par(mod, axis(mod, "tp", 0, 3, 1))))
        reads["as_stored"] = store.get_tensor_with_parallelism(base, target(mod, "as_stored"))
    elif name == "pp_tp":
        t = full(torch, (4, 3), torch.bfloat16)
        p = par(mod, axis(mod, "PP", 0, 2, stage_id=1), axis(mod, "tp", 1, 2, 0))
        assert store.put_tensor_with_parallelism(base, t, p) == 0
        reads["shard"] = store.get_tensor_with_parallelism(base, target(mod, "shard", p))
    elif name == "ep":
        t = full(torch, (3, 2), torch.int32)
        p = par(mod, axis(mod, "ep", 1, 4, expert_id=5))
        assert store.put_tensor_with_parallelism(base, t, p) == 0
        reads["shard"] = store.get_tensor_with_parallelism(base, target(mod, "shard", p))
    elif name == "dp_tp_from":
        t = full(torch, (4, 2), torch.int64)
        buf, ptr, size = serialized(mod, t)
        p = par(mod, axis(mod, "tp", 0, 2, 0), axis(mod, "dp", 0, 2))
        assert store.put_tensor_with_parallelism_from(base, ptr, size, p) == 0
        reads["full"] = store.get_tensor_with_parallelism(base, target(mod, "full", p))
    elif name == "writer":
        t = full(torch, (4, 4), torch.float32)
        w = types.SimpleNamespace(rank=1, size=2, split_dim=0)
        assert store.put_tensor_with_parallelism(base, t, writer_partition=w) == 0
        reads["shard"] = store.get_tensor_with_parallelism(
            base, target(mod, "shard", par(mod, axis(mod, "tp", 1, 2, 0))))
    elif name == "tp_from":
        t = full(torch, (3, 2, 3), torch.float16)
        buf, ptr, size = serialized(mod, t)
        assert store.put_tensor_with_parallelism_from(base, ptr, size, tp(mod, 2, 3, 2)) == 0
        reads["shard"] = store.get_tensor_with_parallelism(
            base, target(mod, "shard", tp(mod, 1, 3, 2)))
        reads["full"] = store.get_tensor_with_parallelism(
            base, target(mod, "full", tp(mod, 0, 1, 2)))
        reads["manifest"] = store.get_tensor_with_parallelism(
            base + "__parallelism_manifest", target(mod, "as_stored"))
    for suffix in OBJECTS[name]:
        objects[suffix] = store.get(base + suffix)
    return objects, reads
