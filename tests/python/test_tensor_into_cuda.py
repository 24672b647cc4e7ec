"""get_tensor_into_cuda / batch_get_tensor_into_cuda: a stored tensor's data read into a tensor
the caller allocated, with upstream's return values (bytes read, or a negative code; -600 for a
destination that does not match). Host tensors run everywhere; CUDA tensors where torch sees a
GPU (scripts/gpu_check.sh runs this file on the GPU machine), with the Store's other calls on
CUDA memory beside them (put_from / get_into of unregistered and registered device memory)."""
import pytest

from mc_helpers import require_torch
from store_helpers import store_fixtures

import tensor_cases

master, holder, store = store_fixtures(lease_ms=500, holder_segment=96 << 20)
PUT_CASES = [n for n, c in tensor_cases.CASES.items() if c[2][0] == "put"]
INVALID_PARAMS, NOT_FOUND = -600, -704


@pytest.fixture(scope="module")
def torch():
    return require_torch()


def same(torch, a, b):
    """Bitwise equality (float8 has no torch.equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    def raw(t):
        return t.cpu().contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(raw(a), raw(b))


def devices(torch):
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda:0")
    return out


@pytest.mark.parametrize("name", PUT_CASES)
def test_every_dtype_and_shape_lands_in_the_callers_tensor(store, torch, name):
    t = tensor_cases.build(torch, name)
    assert store.put_tensor(name, t) == 0
    for dev in devices(torch):
        dst = torch.empty_like(t, device=dev)
        assert store.get_tensor_into_cuda(name, dst) == t.numel() * t.element_size()
        assert same(torch, dst, t), dev


def test_a_batch_reports_each_key_on_its_own(store, torch):
    a = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    b = torch.arange(10, dtype=torch.int16)
    assert store.put_tensor("a", a) == 0
    assert store.put_tensor("b", b) == 0
    assert store.put("bytes", b"x" * 1000) == 0
    assert store.put("short", b"y" * 100) == 0
    assert store.put_tensor("empty", torch.empty(0, 3)) == 0
    da, db = torch.zeros_like(a), torch.zeros_like(b)
    wrong_dtype = torch.zeros(64, 64, dtype=torch.float64)
    wrong_shape = torch.zeros(32, 128)
    strided = torch.zeros(64, 128)[:, ::2]
    keys = ["a", "b", "missing", "a", "a", "a", "bytes", "short", "empty"]
    dsts = [da, db, torch.zeros(3), wrong_dtype, wrong_shape, strided, torch.zeros(250),
            torch.zeros(25), torch.zeros(0, 3)]
    got = store.batch_get_tensor_into_cuda(keys, dsts)
    assert got == [a.nbytes, b.nbytes, NOT_FOUND, INVALID_PARAMS, INVALID_PARAMS,
                   INVALID_PARAMS, INVALID_PARAMS, INVALID_PARAMS, 0]
    assert torch.equal(da, a) and torch.equal(db, b)
    assert not wrong_dtype.any() and not wrong_shape.any() and not strided.any()
    # Destinations that overlap (but are not the same tensor) are refused, not raced.
    big = torch.zeros(2 * 4096, dtype=torch.float32)
    inner = big[100:100 + 4096].view(64, 64)
    whole = big[:4096].view(64, 64)
    assert store.batch_get_tensor_into_cuda(["a", "a", "b"], [inner, whole, db]) == \
        [INVALID_PARAMS, INVALID_PARAMS, b.nbytes]
    assert not big.any()
    # Inconsistent arguments: every entry -600, as upstream; nothing read.
    da.zero_()
    assert store.batch_get_tensor_into_cuda(["a", "b"], [da]) == [INVALID_PARAMS] * 2
    assert not da.any()
    assert store.batch_get_tensor_into_cuda([], []) == []
    assert store.get_tensor_into_cuda("a", "not a tensor") == INVALID_PARAMS
    assert store.get_tensor_into_cuda("a", [1, 2]) == INVALID_PARAMS


def test_a_tp_shard_reads_into_a_tensor_of_its_local_shape(store, torch):
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert store.put_tensor_with_tp("w", t, tp_size=2, split_dim=1) == 0
    for rank in range(2):
        dst = torch.empty(4, 3)
        assert store.get_tensor_into_cuda(f"w_tp_{rank}", dst) == dst.nbytes
        assert torch.equal(dst, t[:, rank * 3:(rank + 1) * 3])
    assert store.get_tensor_into_cuda("w_tp_0", torch.empty(4, 6)) == INVALID_PARAMS


def test_a_destination_registered_by_the_caller_stays_registered(store, torch):
    t = torch.arange(1 << 18, dtype=torch.int32)
    assert store.put_tensor("big", t) == 0
    dst = torch.zeros_like(t)
    assert store.register_buffer(dst.data_ptr(), dst.nbytes) == 0
    try:
        assert store.get_tensor_into_cuda("big", dst) == t.nbytes
        assert torch.equal(dst, t)
        dst.zero_()
        assert store.batch_get_tensor_into_cuda(["big"], [dst]) == [t.nbytes]
        assert torch.equal(dst, t)
    finally:
        assert store.unregister_buffer(dst.data_ptr()) == 0


@pytest.fixture
def cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    return torch


def test_large_cuda_tensors_and_a_batch(store, cuda):
    torch = cuda
    src = [(torch.arange(n, device="cuda:0") % 251).to(torch.uint8).reshape(-1, 1024)
           for n in (8 << 20, 1 << 20, 4096)]
    keys = [f"gpu{i}" for i in range(len(src))]
    assert store.batch_put_tensor(keys, src) == [0] * len(src)
    dsts = [torch.zeros_like(s) for s in src]
    assert store.batch_get_tensor_into_cuda(keys, dsts) == [s.nbytes for s in src]
    torch.cuda.synchronize()
    for s, d in zip(src, dsts):
        assert torch.equal(s, d)


def test_the_store_moves_unregistered_and_registered_cuda_memory(store, cuda):
    torch = cuda
    for n in (5000, 9 << 20):  # one staged chunk, and several
        src = (torch.arange(n, device="cuda:0") % 253).to(torch.uint8)
        assert store.put_from(f"raw{n}", src.data_ptr(), n) == 0
        back = torch.zeros_like(src)
        assert store.get_into(f"raw{n}", back.data_ptr(), n) == n
        assert torch.equal(back, src)
        host = store.get(f"raw{n}")
        assert host == bytes(src.cpu().numpy())
    src = (torch.arange(3 << 20, device="cuda:0") % 241).to(torch.uint8)
    back = torch.zeros_like(src)
    for t in (src, back):
        assert store.register_buffer(t.data_ptr(), t.nbytes) == 0
    try:
        assert store.put_from("reg", src.data_ptr(), src.nbytes) == 0
        assert store.batch_get_into(["reg"], [back.data_ptr()], [back.nbytes]) == [back.nbytes]
        assert torch.equal(back, src)
    finally:
        for t in (src, back):
            assert store.unregister_buffer(t.data_ptr()) == 0
