"""Helpers shared by the tests of the Python package."""
import ctypes
import hashlib
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent

engine = pytest.importorskip(
    "mooncake.engine",
    reason="mooncake is not installed in this interpreter; run scripts/python_test.sh")


def require_torch():
    """The torch module, or a skip with a message (a failure under scripts/python_test.sh)."""
    try:
        import torch
        return torch
    except ImportError as e:
        if os.environ.get("MC_PYTEST_REQUIRE_TORCH") == "1":
            pytest.fail(f"torch is required here but does not import: {e}")
        pytest.skip("torch is not installed (pip install torch==2.13.0+cpu)")


class HostBuffer:
    """`size` bytes of host memory at a fixed address (ctypes)."""

    def __init__(self, size, fill=0):
        self.size = size
        self.array = (ctypes.c_char * size)()
        self.addr = ctypes.addressof(self.array)
        if fill:
            ctypes.memset(self.addr, fill, size)

    def fill(self, value, offset=0, length=None):
        ctypes.memset(self.addr + offset, value, self.size - offset if length is None else length)

    def write(self, data, offset=0):
        ctypes.memmove(self.addr + offset, data, len(data))

    def read(self, offset=0, length=None):
        length = self.size - offset if length is None else length
        return ctypes.string_at(self.addr + offset, length)

    def sha256(self):
        return hashlib.sha256(self.read()).hexdigest()


def make_engine(protocol="tcp"):
    e = engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    return e


def segment_of(e):
    return f"127.0.0.1:{e.get_rpc_port()}"


def closed_port_segment():
    """A segment name whose port nobody listens on."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


class PeerProcess:
    """tests/python/peer.py in a child process: a target engine with `size` registered bytes,
    driven by one-line commands."""

    def __init__(self, size, protocol="tcp", env=None):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), str(size), protocol],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1, env={**os.environ, **(env or {})})
        line = self._readline()
        tag, self.segment, addr, size = line.split()
        assert tag == "ready", line
        self.addr, self.size = int(addr), int(size)

    def _readline(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise AssertionError("peer.py exited; stderr:\n" + self.proc.stderr.read()[-3000:])
        return line.strip()

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._readline()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
