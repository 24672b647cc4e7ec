"""Fixtures of the Python package's tests.

Run by scripts/python_test.sh, which installs the package into build/py-venv and sets
MC_PYTEST_REQUIRE_PACKAGE=1 / MC_PYTEST_REQUIRE_TORCH=1, so that there a missing package or a
missing torch fails instead of skipping. Under another interpreter (e.g. `make pytest`) the
modules skip themselves with a message saying how to run them.
"""
import os

import pytest

# Buffers registered by engine_pair's engines: pytest may drop them before the engines, so
# they are kept for the whole session (a peer's late write must never hit freed memory).
_KEEP_ALIVE = []


def pytest_configure(config):
    if os.environ.get("MC_PYTEST_REQUIRE_PACKAGE") == "1":
        try:
            import mooncake.engine  # noqa: F401
        except ImportError as e:
            raise pytest.UsageError(f"mooncake.engine does not import: {e}")


@pytest.fixture
def engine_pair():
    """Two initialized engines in this process (target, initiator) over TCP, with 1 MiB
    registered on each side."""
    from mc_helpers import HostBuffer, make_engine

    target, initiator = make_engine(), make_engine()
    tbuf, ibuf = HostBuffer(1 << 20), HostBuffer(1 << 20)
    assert target.register_memory(tbuf.addr, tbuf.size) == 0
    assert initiator.register_memory(ibuf.addr, ibuf.size) == 0
    _KEEP_ALIVE.append((tbuf, ibuf))
    yield target, initiator, tbuf, ibuf
