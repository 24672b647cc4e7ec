# The seed's initiator program (shared/seeds/000): with torch_npu and an NPU, exactly the
# seed's (npu:1, protocol "ascend"); else a CUDA tensor where torch and this engine support
# CUDA, else a CPU tensor, with "tcp".
import torch
from mooncake import engine as mooncake_engine
from mooncake.engine import TransferEngine

try:
    import torch_npu  # noqa: F401  (Ascend: adds torch.npu)
except ImportError:
    pass

lines = open("mooncake_te_handshake.txt", encoding="utf-8").read().splitlines()
endpoint, ptr_s, nbytes_s, target_device = lines[:4]
remote_ptr = int(ptr_s)
nbytes = int(nbytes_s)

use_npu = hasattr(torch, "npu") and torch.npu.is_available()
use_cuda = not use_npu and torch.cuda.is_available() and mooncake_engine.SUPPORT_CUDA
if use_npu:
    torch.npu.set_device(min(1, torch.npu.device_count() - 1))
    device = f"npu:{torch.npu.current_device()}"
elif use_cuda:
    torch.cuda.set_device(min(1, torch.cuda.device_count() - 1))
    device = f"cuda:{torch.cuda.current_device()}"
else:
    device = "cpu"
src = torch.full((nbytes,), 0x5A, dtype=torch.uint8, device=device)
before = src.detach().cpu().clone()

engine = TransferEngine()
engine.initialize("127.0.0.1:16002", "P2PHANDSHAKE", "ascend" if use_npu else "tcp", "")
engine.register_memory(src.data_ptr(), src.nbytes, "*")
engine.transfer_sync_write(endpoint, src.data_ptr(), remote_ptr, nbytes)
src.zero_()
if use_npu:
    torch.npu.synchronize()
elif use_cuda:
    torch.cuda.synchronize()
engine.transfer_sync_read(endpoint, src.data_ptr(), remote_ptr, nbytes)
if use_npu:
    torch.npu.synchronize()
elif use_cuda:
    torch.cuda.synchronize()
after = src.detach().cpu()
matched = int((before == after).sum())

shown = " ".join(f"{int(value):02x}" for value in before[:8])
readback = " ".join(f"{int(value):02x}" for value in after[:8])
print(f"target_device {target_device}")
print(f"initiator_device {src.device}")
print(f"before {shown}")
print(f"after {readback}")
print(f"matched_bytes {matched}")
print(f"total_bytes {before.numel()}")
