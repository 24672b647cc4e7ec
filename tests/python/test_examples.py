"""The seed's two programs (examples/python/recv.py, send.py) through run_pair.sh."""
import os
import subprocess
import sys

from mc_helpers import REPO, require_torch

SEED_LINES = [
    "target_device cpu",
    "initiator_device cpu",
    "before 5a 5a 5a 5a 5a 5a 5a 5a",
    "after 5a 5a 5a 5a 5a 5a 5a 5a",
    "matched_bytes 65536",
    "total_bytes 65536",
]


def test_seed_pair():
    require_torch()
    out = subprocess.run([str(REPO / "examples/python/run_pair.sh")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("target_ready cpu 127.0.0.1:")
    assert lines[1:7] == SEED_LINES, out.stdout
    assert lines[7] == "run_pair: OK"
