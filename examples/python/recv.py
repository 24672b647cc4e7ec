# The seed's target program (shared/seeds/000), unchanged but for the device and the
# protocol: the seed used Ascend NPU 0 and "ascend"; here a CPU tensor (a CUDA one where torch
# and this engine both support CUDA) and "tcp".
import time

import torch
from mooncake import engine as mooncake_engine
from mooncake.engine import TransferEngine

use_cuda = torch.cuda.is_available() and mooncake_engine.SUPPORT_CUDA
if use_cuda:
    torch.cuda.set_device(0)
nbytes = 65536
buf = torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0" if use_cuda else "cpu")

engine = TransferEngine()
engine.initialize("127.0.0.1:16001", "P2PHANDSHAKE", "tcp", "")
engine.register_memory(buf.data_ptr(), buf.nbytes, "*")

endpoint = f"127.0.0.1:{engine.get_rpc_port()}"
with open("mooncake_te_handshake.txt", "w", encoding="utf-8") as handle:
    handle.write(f"{endpoint}\n{buf.data_ptr()}\n{nbytes}\n{buf.device}\n")
print(f"target_ready {buf.device} {endpoint}", flush=True)
while True:
    time.sleep(60)
