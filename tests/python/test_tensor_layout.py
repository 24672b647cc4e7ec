"""The Store's tensor family in upstream Mooncake's object layout.

The fixtures under fixtures/upstream_tensors/ are the raw values upstream's client
(mooncake-transfer-engine-non-cuda 0.3.13.post1, with its own mooncake_master) stored for
put_tensor / put_tensor_with_tp of the tensors of tensor_cases.py; regenerate them with
fixtures/regen_upstream_tensors.sh. This package must write the same bytes and read those
bytes back as the same tensors.
"""
import pathlib

import pytest

from mc_helpers import require_torch
from store_helpers import lending_store_fixtures

import tensor_cases
from mooncake import _tensor_layout as layout
from mooncake.store import (MooncakeDistributedStore, ReplicateConfig, _deserialize_tensor,
                            _serialize_tensor, _tensor_metadata_size)

np = pytest.importorskip("numpy")
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "upstream_tensors"
PUT_CASES = [n for n, c in tensor_cases.CASES.items() if c[2][0] == "put"]
TP_CASES = [n for n, c in tensor_cases.CASES.items() if c[2][0] == "tp"]


@pytest.fixture(scope="module")
def torch():
    return require_torch()


master, store, _clean = lending_store_fixtures(1000, 256 << 20, 32 << 20)


def same(torch, a, b):
    """Equal dtype, shape and bytes (NaN-safe, float8-safe)."""
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and
            a.contiguous().reshape(-1).view(torch.uint8).tolist() ==
            b.contiguous().reshape(-1).view(torch.uint8).tolist())


def fixture(name):
    return (FIXTURES / f"{name}.bin").read_bytes()


# ---- the layout itself, no Store ----

def test_fixtures_were_recorded_with_upstream():
    assert "0.3.13" in (FIXTURES / "VERSION").read_text()
    for name in PUT_CASES:
        assert (FIXTURES / f"{name}.bin").exists(), name


@pytest.mark.parametrize("name", PUT_CASES)
def test_header_matches_upstream_byte_for_byte(torch, name):
    t = tensor_cases.build(torch, name)
    meta, ptr, size, owner = _serialize_tensor(t)
    raw = fixture(name)
    assert meta == raw[:_tensor_metadata_size()]
    assert size == len(raw) - 304
    assert same(torch, _deserialize_tensor(raw), t)


def test_parse_rejects_what_upstream_rejects(torch):
    raw = bytearray(fixture("f32_2x3"))
    assert layout.parse(raw, len(raw)) is not None
    bad = []
    for off, val in ((0, b"MCT1"),                  # magic
                     (4, b"\x02\x00"),              # version
                     (6, b"\x00\x01"),              # header_size
                     (8, b"\x0f\x00\x00\x00"),      # dtype 15 (NR_DTYPES)
                     (12, b"\x09\x00\x00\x00"),     # ndim 9
                     (16, b"\x02\x00\x00\x00"),     # layout kind 2
                     (32, b"\x19\x00\x00\x00"),     # data_bytes 25 != 24
                     (104, b"\x03\x00\x00\x00"),    # local shape 3x3 != 24 bytes
                     (56, b"\x00\x00\x00\x00"),     # global dim 2 not -1
                     (168, b"\x05\x00\x00\x00")):   # axis_count 5
        b = bytearray(raw)
        b[off:off + len(val)] = val
        bad.append(bytes(b))
    bad.append(bytes(raw[:-1]))                     # truncated data
    bad.append(bytes(raw) + b"\0")                  # trailing byte
    bad.append(bytes(raw[:100]))                    # truncated header
    for b in bad:
        assert layout.parse(b, len(b)) is None
        with pytest.raises(ValueError):
            _deserialize_tensor(b)


def test_shard_header_matches_upstream(torch):
    t = tensor_cases.build(torch, "bf16_tp4_dim1")
    for rank in range(4):
        shard = t.narrow(1, rank * 2, 2).contiguous()
        md = layout.shard_metadata(tuple(t.shape), shard, layout.dtype_code(t.dtype), rank, 4,
                                   1)
        assert md.pack() == fixture(f"bf16_tp4_dim1_tp_{rank}")[:304]


# ---- through the Store ----

@pytest.mark.parametrize("name", PUT_CASES)
def test_put_tensor_stores_upstreams_bytes_and_reads_them(torch, store, name):
    t = tensor_cases.build(torch, name)
    assert store.put_tensor("ours_" + name, t) == 0
    assert store.get("ours_" + name) == fixture(name)
    # the object upstream's client wrote, read with this get_tensor
    assert store.put("theirs_" + name, fixture(name)) == 0
    back = store.get_tensor("theirs_" + name)
    assert same(torch, back, t)  # 0-d stays 0-d (upstream hands back shape (1,))


@pytest.mark.parametrize("name", TP_CASES)
def test_put_tensor_with_tp_matches_upstream(torch, store, name):
    _, _, (_, tp_size, split_dim) = tensor_cases.CASES[name]
    t = tensor_cases.build(torch, name)
    assert store.put_tensor_with_tp(name, t, tp_rank=1, tp_size=tp_size,
                                    split_dim=split_dim) == 0
    step = t.shape[split_dim] // tp_size
    for rank in range(tp_size):
        assert store.get(f"{name}_tp_{rank}") == fixture(f"{name}_tp_{rank}")
        want = t.narrow(split_dim, rank * step, step)
        assert same(torch, store.get_tensor_with_tp(name, rank, tp_size, split_dim), want)
    assert store.is_exist(name) == 0  # only the shards exist
    shards = store.batch_get_tensor_with_tp([name, "missing"], tp_rank=0, tp_size=tp_size)
    assert same(torch, shards[0], t.narrow(split_dim, 0, step)) and shards[1] is None
    # tp_size 1 is a plain put / get
    assert store.put_tensor_with_tp(name + "_1", t, tp_size=1) == 0
    assert same(torch, store.get_tensor_with_tp(name + "_1"), t)


def test_tp_refuses_uneven_and_bad_splits(torch, store):
    t = torch.zeros(5, 4)
    assert store.put_tensor_with_tp("uneven", t, tp_size=2, split_dim=0) == -600
    assert store.put_tensor_with_tp("baddim", t, tp_size=2, split_dim=2) == -600
    assert store.put_tensor_with_tp("negdim", t, tp_size=2, split_dim=-1) == -600
    assert store.batch_is_exist(["uneven_tp_0", "baddim_tp_0", "negdim_tp_0"]) == [0, 0, 0]
    codes = store.batch_put_tensor_with_tp(["ok", "uneven"], [torch.ones(4, 2), t],
                                           tp_size=2, split_dim=0)
    assert codes == [0, -600]
    assert same(torch, store.get_tensor("ok_tp_1"), torch.ones(2, 2))


def test_not_a_tensor_and_misses(torch, store):
    assert store.put_tensor("x", [1, 2]) == -600
    assert store.put_tensor("x", torch.zeros(2, dtype=torch.complex64)) == -600
    assert store.put_tensor("x", torch.zeros([1] * 9)) == -600
    assert store.put_tensor("x", torch.zeros(3, device="meta")) == -600
    assert store.put_tensor("x", torch.zeros(3, 3).to_sparse()) == -600
    assert store.is_exist("x") == 0
    neg = torch._neg_view(torch.arange(4.0))
    assert store.put_tensor("neg", neg) == 0
    assert same(torch, store.get_tensor("neg"), -torch.arange(4.0))
    assert store.get_tensor("missing") is None
    assert store.put("raw", b"not a tensor object at all" * 20) == 0
    assert store.get_tensor("raw") is None
    assert store.batch_get_tensor(["raw", "missing"]) == [None, None]
    assert store.batch_put_tensor([], []) == []
    assert store.batch_put_tensor(["a", "b"], [torch.zeros(1)]) == [-600, -600]


def test_batch_put_and_get(torch, store):
    tensors = [tensor_cases.build(torch, n) for n in PUT_CASES]
    keys = ["b_" + n for n in PUT_CASES]
    codes = store.batch_put_tensor(keys + ["b_bad"], tensors + ["nope"])
    assert codes == [0] * len(keys) + [-600]
    back = store.batch_get_tensor(keys + ["b_missing"])
    assert back[-1] is None
    for t, b in zip(tensors, back):
        assert same(torch, b, t)
    for n, k in zip(PUT_CASES, keys):
        assert store.get(k) == fixture(n)


def test_non_contiguous_and_strided_input(torch, store):
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()[1:5]
    assert not t.is_contiguous()
    assert store.put_tensor("nc", t) == 0
    assert same(torch, store.get_tensor("nc"), t.contiguous())


def test_get_tensor_result_is_independent_and_writable(torch, store):
    t = torch.arange(10, dtype=torch.int32)
    assert store.put_tensor("w", t) == 0
    a, b = store.get_tensor("w"), store.get_tensor("w")
    a += 1
    assert same(torch, b, t) and same(torch, a, t + 1)


def test_put_from_and_get_into_registered_buffers(torch, store):
    t = tensor_cases.build(torch, "bf16_3x3")
    raw = np.frombuffer(fixture("bf16_3x3"), dtype=np.uint8).copy()
    src = np.zeros(4096, dtype=np.uint8)
    src[:raw.size] = raw
    dst = np.zeros(4096, dtype=np.uint8)
    for a in (src, dst):
        assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    try:
        assert store.put_tensor_from("pf", src.ctypes.data, raw.size) == 0
        assert store.get("pf") == fixture("bf16_3x3")
        got = store.get_tensor_into("pf", dst.ctypes.data, dst.nbytes)
        assert same(torch, got, t)
        assert got.data_ptr() == dst.ctypes.data + 304  # a view of the caller's buffer
        # a buffer that does not hold a tensor object, or a size that cuts it
        assert store.put_tensor_from("pf2", src.ctypes.data, raw.size - 1) == -600
        assert store.put_tensor_from("pf2", src.ctypes.data + 1, raw.size) == -600
        assert store.put_tensor_from("pf2", 0, raw.size) == -600
        assert store.is_exist("pf2") == 0
        assert store.get_tensor_into("pf", dst.ctypes.data, 100) is None   # too small
        assert store.get_tensor_into("missing", dst.ctypes.data, dst.nbytes) is None
        assert store.get_tensor_into("pf", 0, dst.nbytes) is None
        # batches
        assert store.batch_put_tensor_from(["pa", "pb"], [src.ctypes.data] * 2,
                                           [raw.size] * 2) == [0, 0]
        assert store.batch_put_tensor_from(["pc", "pd"], [src.ctypes.data] * 2,
                                           [raw.size, 9]) == [-600, -600]
        half = dst.nbytes // 2
        out = store.batch_get_tensor_into(["pa", "missing", "pb"],
                                          [dst.ctypes.data, dst.ctypes.data,
                                           dst.ctypes.data + half],
                                          [half, half, half])
        assert same(torch, out[0], t) and out[1] is None and same(torch, out[2], t)
        assert store.batch_get_tensor_into(["pa"], [dst.ctypes.data], []) == [-600]
        # TP forms of the buffer calls
        full = tensor_cases.build(torch, "f32_tp2_dim0")
        obj = np.frombuffer(layout.full_metadata(full, 0).pack() +
                            full.numpy().tobytes(), dtype=np.uint8)
        src[:obj.size] = obj
        assert store.put_tensor_with_tp_from("tpf", src.ctypes.data, obj.size, tp_size=2,
                                             split_dim=0) == 0
        for r in range(2):
            assert store.get(f"tpf_tp_{r}") == fixture(f"f32_tp2_dim0_tp_{r}")
        got = store.get_tensor_with_tp_into("tpf", dst.ctypes.data, dst.nbytes, tp_rank=1,
                                            tp_size=2)
        assert same(torch, got, full[2:])
        out = store.batch_get_tensor_with_tp_into(["tpf"], [dst.ctypes.data], [dst.nbytes],
                                                  tp_rank=0, tp_size=2)
        assert same(torch, out[0], full[:2])
        assert store.batch_put_tensor_with_tp_from(["tpg", "tph"], [src.ctypes.data] * 2,
                                                   [obj.size, 3], tp_size=2) == [0, -600]
    finally:
        for a in (src, dst):
            store.unregister_buffer(a.ctypes.data)


def test_pub_tensor_replicas_and_config_check(torch, master, store):
    other = MooncakeDistributedStore()
    assert other.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "",
                       master.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        t = torch.arange(100, dtype=torch.float16)
        assert store.pub_tensor("pub", t, cfg) == 0
        assert same(torch, other.get_tensor("pub"), t)
        assert store.batch_pub_tensor(["pub1", "pub2"], [t, t], cfg) == [0, 0]
        assert store.pub_tensor_with_tp("pubtp", torch.ones(4, 4), cfg, tp_size=2,
                                        split_dim=1) == 0
        assert same(torch, other.get_tensor("pubtp_tp_1"), torch.ones(4, 2))
        assert store.batch_pub_tensor_with_tp(["pubtp2"], [torch.ones(2, 2)], cfg,
                                              tp_size=2) == [0]
        bad = ReplicateConfig()
        bad.replica_num = 2
        bad.preferred_segments = ["only-one"]
        assert store.pub_tensor("pub3", t, bad) == -600
        assert store.batch_pub_tensor(["pub3"], [t], bad) == [-600]
        assert store.is_exist("pub3") == 0
    finally:
        other.close()


def test_existing_key_keeps_its_tensor(torch, store):
    assert store.put_tensor("k", torch.zeros(3)) == 0
    assert store.put_tensor("k", torch.ones(3)) == 0  # as put(): the stored value stays
    assert same(torch, store.get_tensor("k"), torch.zeros(3))


def test_upsert_tensor(torch, store):
    if not hasattr(store, "upsert_parts") and not hasattr(store, "batch_upsert_from"):
        # The C++ upsert primitives come with another change; until then the tensor upserts
        # say so rather than pretend.
        assert store.upsert_tensor("u", torch.zeros(3)) == -1
        pytest.skip("this build has no upsert primitive")
    assert store.upsert_tensor("u", torch.zeros(3)) == 0
    assert store.upsert_tensor("u", torch.arange(5)) == 0
    assert same(torch, store.get_tensor("u"), torch.arange(5))
    assert store.batch_upsert_tensor(["u", "v"], [torch.ones(2), torch.ones(1)]) == [0, 0]
    assert same(torch, store.get_tensor("u"), torch.ones(2))
    assert store.upsert_tensor_with_tp("ut", torch.ones(4), tp_size=2) == 0
    assert store.upsert_tensor_with_tp("ut", torch.zeros(4), tp_size=2) == 0
    assert same(torch, store.get_tensor("ut_tp_1"), torch.zeros(2))


def test_safetensors_round_trip(torch, store, tmp_path):
    pytest.importorskip("safetensors")
    t = tensor_cases.build(torch, "bf16_3x3")
    assert store.put_tensor("st", t) == 0
    path = tmp_path / "st.safetensors"
    assert store.save_tensor_to_safetensor("st", str(path)) == 0
    from safetensors.torch import load_file
    assert same(torch, load_file(str(path))["st"], t)
    assert store.save_tensor_to_safetensor("missing", str(tmp_path / "m")) == -1100
    assert store.save_tensor_to_safetensor("st", str(tmp_path / "no" / "dir" / "f")) == -600
    # load under another key: the file has no tensor of that name, so its first one is used
    back = store.load_tensor_from_safetensor("st_copy", str(path))
    assert same(torch, back, t) and same(torch, store.get_tensor("st_copy"), t)
    # key None: the file name is the key
    assert same(torch, store.load_tensor_from_safetensor(None, str(path)), t)
    assert same(torch, store.get_tensor(str(path)), t)
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "absent")) is None
    (tmp_path / "junk").write_bytes(b"junk")
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "junk")) is None


def test_large_tensor_round_trip(torch, store):
    t = torch.arange(16 << 20, dtype=torch.int32).reshape(4096, -1)   # 64 MiB
    assert store.put_tensor("big", t) == 0
    assert store.get_size("big") == t.numel() * 4 + 304
    assert torch.equal(store.get_tensor("big"), t)


class LocalRegisterStore(MooncakeDistributedStore):
    """Stands in for a build whose register_buffer can register local-only memory (it
    registers as the plain call does), counting what is registered and unregistered."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def register_buffer(self, ptr, size, remote_accessible=True):
        rc = super().register_buffer(ptr, size)
        self.calls.append(("reg", ptr, size, remote_accessible, rc))
        return rc

    def unregister_buffer(self, ptr):
        self.calls.append(("unreg", ptr))
        return super().unregister_buffer(ptr)


def test_plain_build_stages_without_registering(torch, store):
    t = torch.arange(1 << 20, dtype=torch.int32)
    assert store.put_tensor("staged", t) == 0
    assert torch.equal(store.get_tensor("staged"), t)
    # register_buffer here takes no remote_accessible: no temporary registration was made,
    # so the tensor's memory registers now without an overlap
    assert store.register_buffer(t.data_ptr(), t.numel() * 4) == 0
    assert store.unregister_buffer(t.data_ptr()) == 0


def test_threads_put_overlapping_tensors(torch, master):
    """With local-only registration, large tensors are registered for the duration of a put;
    threads putting the same or overlapping memory at once share or wait for those
    registrations, never lose them, and none is left behind."""
    import threading
    s = LocalRegisterStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 256 << 20, 16 << 20, "tcp", "",
                   master.addr) == 0
    base = torch.arange(3 << 20, dtype=torch.int32)          # 12 MiB
    views = [base, base, base[: 1 << 20], base[1 << 19:], base[2 << 20:]]
    errors = []

    def work(i):
        try:
            for r in range(4):
                key = f"ov_{i}_{r}"
                if s.put_tensor(key, views[i]) != 0:
                    errors.append((key, "put"))
                elif not torch.equal(s.get_tensor(key), views[i]):
                    errors.append((key, "bytes"))
        except Exception as e:  # reported below
            errors.append(repr(e))

    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(views))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        regs = [c for c in s.calls if c[0] == "reg"]
        assert regs and all(c[3] is False for c in regs)        # local-only, always
        made = [c[1] for c in regs if c[4] == 0]
        undone = [c[1] for c in s.calls if c[0] == "unreg"]
        assert sorted(made) == sorted(undone)
        # a small tensor is staged, not registered
        n = len(s.calls)
        assert s.put_tensor("small", torch.zeros(16)) == 0 and len(s.calls) == n
        assert s.register_buffer(base.data_ptr(), base.numel() * 4) == 0
        assert s.unregister_buffer(base.data_ptr()) == 0
    finally:
        s.remove_all(force=True)
        s.close()


def _upstream_python():
    """Upstream's wheel's interpreter: $MC_UPSTREAM_PYTHON, else build/upstream-venv (made by
    tests/interop/setup_upstream_venv.sh); None if neither exists."""
    import os
    from mc_helpers import REPO
    for p in (os.environ.get("MC_UPSTREAM_PYTHON"),
              str(REPO / "build" / "upstream-venv" / "bin" / "python")):
        if p and pathlib.Path(p).exists():
            return p
    return None


def test_upstream_reads_our_objects(torch, store, tmp_path):
    """The objects this Store holds, decoded by upstream's own code (its wheel's
    _deserialize_tensor), are the tensors that were put."""
    import importlib.util
    import os
    import subprocess
    py = _upstream_python()
    if py is None:
        pytest.skip("upstream's wheel not installed (tests/interop/setup_upstream_venv.sh, or "
                    "MC_UPSTREAM_PYTHON): not checked against upstream's decoder")
    # upstream's venv has no torch of its own: lend it ours, without our mooncake package
    lend = tmp_path / "lend"
    lend.mkdir()
    site = pathlib.Path(importlib.util.find_spec("torch").origin).parents[1]
    for entry in site.iterdir():
        if not entry.name.startswith(("mooncake", "_distutils", "distutils", "pip", "setup",
                                      "pkg_resources", "zz_")) and not entry.name.endswith(
                                          ".pth"):
            (lend / entry.name).symlink_to(entry)
    args = []
    for name in PUT_CASES:
        assert store.put_tensor("up_" + name, tensor_cases.build(torch, name)) == 0
        f = tmp_path / f"{name}.bin"
        f.write_bytes(store.get("up_" + name))
        args.append(f"{name}={f}")
    for name in TP_CASES:
        _, _, (_, tp_size, split_dim) = tensor_cases.CASES[name]
        assert store.put_tensor_with_tp("up_" + name, tensor_cases.build(torch, name),
                                        tp_size=tp_size, split_dim=split_dim) == 0
        for r in range(tp_size):
            f = tmp_path / f"{name}_tp_{r}.bin"
            f.write_bytes(store.get(f"up_{name}_tp_{r}"))
            args.append(f"{name}#{r}={f}")
    env = dict(os.environ, PYTHONPATH=str(lend))
    out = subprocess.run([py, str(FIXTURES.parent / "upstream_check_tensors.py")] + args,
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                         env=env)
    lines = [l for l in out.stdout.splitlines() if l.startswith(("OK", "BAD"))]
    assert out.returncode == 0 and len(lines) == len(args), out.stdout + out.stderr[-3000:]
    assert all(l.startswith("OK") for l in lines), lines
