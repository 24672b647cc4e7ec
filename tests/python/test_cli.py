"""The command-line tools `pip install .` puts into the environment (upstream's test_cli.py
checks them with `which`), and the `python -m mooncake.cli*` launchers of upstream's entry
points."""
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.request

import pytest

from store_helpers import free_port, wait_until

BIN = pathlib.Path(sys.executable).parent
TOOLS = ["mooncake_master", "transfer_engine_bench", "mooncake_http_metadata_server"]


def env_with_bin():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_is_on_the_environments_path(tool):
    path = shutil.which(tool, path=env_with_bin()["PATH"])
    assert path is not None and pathlib.Path(path).parent == BIN, path
    assert os.access(path, os.X_OK)


def test_mooncake_client_is_installed_when_built():
    # mooncake_client comes with the standalone-client change; once its CMake target exists
    # python/CMakeLists.txt (MC_PY_TOOLS) installs it like the others.
    if not (BIN / "mooncake_client").exists():
        pytest.skip("mooncake_client is not built by this tree")
    assert os.access(BIN / "mooncake_client", os.X_OK)


def test_launcher_runs_the_master_in_its_own_process():
    rpc, metrics = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake.cli", f"--rpc_port={rpc}",
                             f"--metrics_port={metrics}", "--rpc_address=127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def serving():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics",
                                            timeout=0.5) as r:
                    return r.status == 200
            except OSError:
                return proc.poll() is not None
        wait_until(serving, 15, what="the master to serve /metrics")
        assert proc.poll() is None
        # execv: the launcher's pid is the master's
        exe = os.readlink(f"/proc/{proc.pid}/exe")
        assert os.path.basename(exe) == "mooncake_master", exe
    finally:
        proc.terminate()
        proc.wait(10)


def test_bench_launcher_passes_flags():
    out = subprocess.run([sys.executable, "-m", "mooncake.cli_bench", "--help"],
                         capture_output=True, text=True, timeout=30)
    assert "transfer_engine_bench" in out.stdout + out.stderr


def test_launcher_of_a_missing_tool_says_so(monkeypatch):
    from mooncake import _launch
    assert _launch.find_tool("mooncake_master") is not None
    assert _launch.find_tool("no_such_tool_here") is None
    assert _launch.run("no_such_tool_here") == 127
