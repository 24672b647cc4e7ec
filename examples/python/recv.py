# The seed's target program (shared/seeds/000): with torch_npu and an NPU, exactly the seed's
# (npu:0, protocol "ascend"); else a CUDA tensor where torch and this engine support CUDA, else
# a CPU tensor, with "tcp".
import time

import torch
from mooncake import engine as mooncake_engine
from mooncake.engine import TransferEngine

try:
    import torch_npu  # noqa: F401  (Ascend: adds torch.npu)
except ImportError:
    pass
use_npu = hasattr(torch, "npu") and torch.npu.is_available()
use_cuda = not use_npu and torch.cuda.is_available() and mooncake_engine.SUPPORT_CUDA
if use_npu:
    torch.npu.set_device(0)
elif use_cuda:
    torch.cuda.set_device(0)
nbytes = 65536
device = "npu:0" if use_npu else "cuda:0" if use_cuda else "cpu"
buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)

engine = TransferEngine()
engine.initialize("127.0.0.1:16001", "P2PHANDSHAKE", "ascend" if use_npu else "tcp", "")
engine.register_memory(buf.data_ptr(), buf.nbytes, "*")

endpoint = f"127.0.0.1:{engine.get_rpc_port()}"
with open("mooncake_te_handshake.txt", "w", encoding="utf-8") as handle:
    handle.write(f"{endpoint}\n{buf.data_ptr()}\n{nbytes}\n{buf.device}\n")
print(f"target_ready {buf.device} {endpoint}", flush=True)
while True:
    time.sleep(60)
