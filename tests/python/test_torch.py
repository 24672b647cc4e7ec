"""torch CPU tensors as buffers, and the vLLM pattern: many threads doing
batch_transfer_sync_write at once into one target in another process."""
import hashlib
import threading

import pytest

from mc_helpers import PeerProcess, engine, make_engine, require_torch, segment_of


@pytest.fixture
def torch():
    return require_torch()


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
def test_tensors_round_trip(torch, dtype):
    dt = getattr(torch, dtype)
    target, initiator = make_engine(), make_engine()
    src = (torch.arange(100_003) % 97).to(dt)
    dst = torch.zeros_like(src)
    back = torch.zeros_like(src)
    assert initiator.batch_register_memory([src.data_ptr(), back.data_ptr()],
                                           [src.nbytes, back.nbytes]) == 0
    assert target.register_memory(dst.data_ptr(), dst.nbytes, "cpu:0") == 0
    seg = segment_of(target)
    assert initiator.transfer_sync_write(seg, src.data_ptr(), dst.data_ptr(), src.nbytes) == 0
    assert torch.equal(dst, src)
    assert initiator.transfer_sync_read(seg, back.data_ptr(), dst.data_ptr(), dst.nbytes) == 0
    assert torch.equal(back, src)


def test_tensor_slices_as_blocks(torch):
    """KV-cache style: blocks of one big tensor, addressed by data_ptr() of slices."""
    target, initiator = make_engine(), make_engine()
    cache = torch.randn(64, 16, 128)          # 64 blocks of 8 KiB
    remote = torch.zeros_like(cache)
    assert initiator.register_memory(cache.data_ptr(), cache.nbytes) == 0
    assert target.register_memory(remote.data_ptr(), remote.nbytes) == 0
    picks = [3, 17, 40, 63]
    assert initiator.batch_transfer_sync_write(
        segment_of(target), [cache[i].data_ptr() for i in picks],
        [remote[63 - i].data_ptr() for i in picks], [cache[i].nbytes for i in picks]) == 0
    for i in picks:
        assert torch.equal(remote[63 - i], cache[i])
    assert float(remote[0].abs().sum()) != 0 and float(remote[1].abs().sum()) == 0


@pytest.mark.parametrize("protocol", ["tcp", "rdma"])
def test_vllm_pattern_ten_threads_into_one_target(torch, protocol):
    threads, blocks, blk = 10, 32, 32 << 10     # 10 MiB in all
    size = threads * blocks * blk
    peer = PeerProcess(size, protocol="tcp")
    try:
        e = make_engine(protocol)
        src = torch.randint(0, 256, (size,), dtype=torch.uint8)
        assert e.register_memory(src.data_ptr(), src.nbytes) == 0
        barrier = threading.Barrier(threads)
        results = [None] * threads

        def worker(t):
            # thread t owns blocks t, t+threads, ... (interleaved, as KV blocks are)
            offs = [(b * threads + t) * blk for b in range(blocks)]
            barrier.wait()
            rcs = []
            for half in (offs[: blocks // 2], offs[blocks // 2:]):
                rcs.append(e.batch_transfer_sync_write(
                    peer.segment, [src.data_ptr() + o for o in half],
                    [peer.addr + o for o in half], [blk] * len(half)))
            results[t] = rcs

        ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        assert results == [[0, 0]] * threads
        # every byte, checked on the target ...
        assert peer.command("sha256") == hashlib.sha256(src.numpy().tobytes()).hexdigest()
        # ... and read back
        back = torch.zeros_like(src)
        assert e.register_memory(back.data_ptr(), back.nbytes) == 0
        assert e.transfer_sync_read(peer.segment, back.data_ptr(), peer.addr, size) == 0
        assert torch.equal(back, src)
        assert e._pending_batches() == 0
    finally:
        peer.close()


def test_notify_to_another_process(torch):
    peer = PeerProcess(4096)
    try:
        e = make_engine()
        t = torch.ones(4096, dtype=torch.uint8)
        assert e.register_memory(t.data_ptr(), t.nbytes) == 0
        n = engine.TransferNotify("sender", "done")
        assert e.transfer_sync(peer.segment, t.data_ptr(), peer.addr, 4096, engine.Write, n) == 0
        assert peer.command("notifies") == "sender=done"
        assert peer.command("notifies") == "-"
    finally:
        peer.close()
