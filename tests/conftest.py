"""Shared pytest fixtures: where the C++ build is, and helpers to drive peer processes."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("MC_BUILD_DIR", REPO / "build"))
    if not (d / "tests" / "mp_peer").exists():
        pytest.fail(f"{d}/tests/mp_peer is missing: build first (make build) or set MC_BUILD_DIR")
    return d


class Peer:
    """A peer process speaking the line protocol of tests/mp_peer.cc / upstream_peer.py."""

    def __init__(self, argv, timeout=60):
        self.timeout = timeout
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)

    def readline(self):
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            raise AssertionError(f"peer {self.proc.args[:3]} closed stdout; stderr:\n{err[-3000:]}")
        return line.strip()

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.readline()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()
