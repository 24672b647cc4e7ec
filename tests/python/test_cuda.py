"""torch CUDA tensors with the whole API: registration by "*" and "cuda:0", transfers between
GPU and host tensors in one process (TCP, staged) and read/write_bytes on GPU memory. Skips
itself where torch has no usable GPU; scripts/gpu_check.sh runs it on a GPU machine."""
import pytest

from mc_helpers import make_engine, require_torch, segment_of


@pytest.fixture
def torch():
    t = require_torch()
    if not t.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    return t


@pytest.mark.parametrize("location", ["*", "cuda:0"])
def test_cuda_tensors_round_trip(torch, location):
    target, initiator = make_engine(), make_engine()
    src = (torch.arange(1_000_003, device="cuda:0") % 251).to(torch.uint8)
    dst = torch.zeros_like(src)
    back = torch.zeros_like(src)
    host = torch.zeros(src.numel(), dtype=torch.uint8)
    assert initiator.register_memory(src.data_ptr(), src.nbytes, location) == 0
    assert initiator.register_memory(back.data_ptr(), back.nbytes, location) == 0
    assert target.register_memory(dst.data_ptr(), dst.nbytes, location) == 0
    assert target.register_memory(host.data_ptr(), host.nbytes, "cpu:0") == 0
    seg = segment_of(target)
    torch.cuda.synchronize()
    assert initiator.transfer_sync_write(seg, src.data_ptr(), dst.data_ptr(), src.nbytes) == 0
    assert torch.equal(dst, src)
    assert initiator.transfer_sync_write(seg, src.data_ptr(), host.data_ptr(), src.nbytes) == 0
    assert torch.equal(host, src.cpu())
    assert initiator.transfer_sync_read(seg, back.data_ptr(), dst.data_ptr(), dst.nbytes) == 0
    assert torch.equal(back, src)


def test_bytes_helpers_on_gpu_memory(torch):
    e = make_engine()
    t = torch.zeros(64, dtype=torch.uint8, device="cuda:0")
    assert e.write_bytes_to_buffer(t.data_ptr(), b"abcdefgh", 8) == 0
    assert bytes(t[:8].cpu().tolist()) == b"abcdefgh"
    assert e.read_bytes_from_buffer(t.data_ptr(), 8) == b"abcdefgh"
