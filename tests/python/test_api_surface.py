"""The names, arguments and conventions of mooncake.engine against upstream's, the type
stubs against the module, the version, and the installed tool."""
import ast
import importlib.metadata
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from mc_helpers import REPO, engine

# Upstream's methods; True where its arguments are positional-only (declared without py::arg).
UPSTREAM_METHODS = {
    "initialize": True, "initialize_ext": True, "get_rpc_port": True,
    "allocate_managed_buffer": True, "free_managed_buffer": True,
    "transfer_sync_write": False, "transfer_sync_read": False,
    "batch_transfer_sync_write": False, "batch_transfer_sync_read": False,
    "batch_transfer_async_write": False, "batch_transfer_async_read": False,
    "transfer_sync": False, "batch_transfer_sync": False, "batch_transfer_async": False,
    "get_batch_transfer_status": True, "transfer_submit_write": False,
    "transfer_check_status": True, "write_bytes_to_buffer": True,
    "read_bytes_from_buffer": True, "register_memory": False, "unregister_memory": True,
    "batch_register_memory": False, "batch_unregister_memory": True,
    "get_local_topology": False, "get_first_buffer_address": True,
    "warmup_efa_segment": False, "get_notifies": True, "send_probe": False,
    "get_engine": True, "get_engine_ptr": True,
}

STUB = pathlib.Path(engine.__file__).with_name("engine.pyi")


def split_top_level(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def runtime_signature(name):
    """(parameter names without self, index of '/' or None, names with defaults) from the
    pybind11 docstring's first line."""
    first = getattr(engine.TransferEngine, name).__doc__.splitlines()[0]
    m = re.match(rf"{name}\((.*)\) -> ", first)
    assert m, first
    params = split_top_level(m.group(1))[1:]  # drop self
    names, slash, defaults = [], None, set()
    for p in params:
        if p == "/":
            slash = len(names)
            continue
        pname = p.split(":")[0].strip()
        names.append(pname)
        if "=" in p:
            defaults.add(pname)
    return names, slash, defaults


def stub_methods():
    tree = ast.parse(STUB.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TransferEngine")
    out = {}
    for f in cls.body:
        if isinstance(f, ast.FunctionDef):
            a = f.args
            posonly = [x.arg for x in a.posonlyargs]
            rest = [x.arg for x in a.args]
            names = (posonly + rest)[1:]
            with_default = set((posonly + rest)[len(posonly + rest) - len(a.defaults):])
            out[f.name] = (names, len(posonly) - 1 if posonly else None, with_default,
                           ast.get_docstring(f))
    return out


@pytest.mark.parametrize("name", sorted(UPSTREAM_METHODS))
def test_method_exists_with_docstring(name):
    method = getattr(engine.TransferEngine, name)
    doc = method.__doc__
    assert doc and len(doc.splitlines()) >= 3, f"{name} needs a docstring stating its contract"


@pytest.mark.parametrize("name", sorted(UPSTREAM_METHODS))
def test_positional_only_as_upstream(name):
    names, slash, _ = runtime_signature(name)
    if UPSTREAM_METHODS[name] and names:
        assert slash == len(names), f"{name}: upstream has no py::arg, so positional-only"
    if not UPSTREAM_METHODS[name]:
        assert slash is None, f"{name}: upstream names its arguments"


def test_keyword_arguments_are_rejected_where_upstream_rejects_them():
    e = engine.TransferEngine()
    with pytest.raises(TypeError):
        e.initialize(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE",
                     protocol="tcp", device_name="")
    with pytest.raises(TypeError):
        e.unregister_memory(buffer_addr=1)


def test_stub_matches_module():
    stubs = stub_methods()
    runtime = {n for n in dir(engine.TransferEngine)
               if not n.startswith(("__", "_pybind11")) and callable(getattr(engine.TransferEngine, n))
               and n != "TransferOpcode"}
    assert runtime == set(stubs) - {"__init__"}, "engine.pyi and the module list other methods"
    for name in sorted(runtime):
        names, slash, defaults = runtime_signature(name)
        s_names, s_slash, s_defaults, s_doc = stubs[name]
        assert names == s_names, name
        assert slash == s_slash, name
        assert defaults == s_defaults, name
        assert s_doc, f"engine.pyi: {name} has no docstring"


def test_opcode_enum():
    assert int(engine.TransferOpcode.Read) == 0 and int(engine.TransferOpcode.Write) == 1
    assert engine.Read == engine.TransferOpcode.Read and engine.Write == engine.TransferOpcode.Write
    assert engine.TransferEngine.TransferOpcode is engine.TransferOpcode
    assert engine.TransferEngine.TransferOpcode.Write == engine.Write
    assert engine.Write == 1 and engine.Read == 0 and engine.Read < engine.Write  # arithmetic
    assert engine.TransferOpcode(1) == engine.Write


def test_module_attributes():
    for name in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA",
                 "SUPPORT_INTRA_NVLINK"):
        assert getattr(engine, name) is False
    # CUDA memory is supported by every build (runtime loaded with dlopen when needed).
    assert engine.SUPPORT_CUDA is True
    assert "ERR_ADDRESS_OVERLAPPED" in engine.__doc__


def test_transfer_notify():
    n = engine.TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b")
    n = engine.TransferNotify(name="x", msg="y")
    n.msg = "z"
    assert (n.name, n.msg) == ("x", "z")
    assert engine.TransferNotify().name == ""
    assert "x" in repr(n)


def test_version_is_the_cmake_project_version():
    cmake = (REPO / "CMakeLists.txt").read_text()
    version = re.search(r"project\(\s*mooncake_te\s+VERSION\s+([0-9.]+)", cmake).group(1)
    import mooncake
    assert mooncake.__version__ == engine.__version__ == version
    assert importlib.metadata.version("mooncake-transfer-engine") == version
    meta = importlib.metadata.metadata("mooncake-transfer-engine")
    assert meta["Summary"] and meta["Requires-Python"]


def test_help_shows_the_contract():
    text = engine.TransferEngine.get_batch_transfer_status.__doc__
    assert "batch_ids" in text and "Returns 0" in text
    out = subprocess.run([sys.executable, "-c", "import mooncake.engine as m; help(m.TransferEngine)"],
                         capture_output=True, text=True, env={"PAGER": "cat", "TERM": "dumb"},
                         timeout=60)
    assert out.returncode == 0
    assert "MC_TRANSFER_TIMEOUT" in out.stdout and "transfer_check_status" in out.stdout


def test_bench_tool_is_installed_next_to_the_interpreter():
    bindir = pathlib.Path(sys.executable).parent
    tool = shutil.which("transfer_engine_bench", path=str(bindir))
    assert tool, f"transfer_engine_bench is not in {bindir}"
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    assert "transfer_engine_bench" in out.stdout + out.stderr


def test_before_initialize_every_call_fails_cleanly(capfd):
    e = engine.TransferEngine()
    assert e.get_rpc_port() == -1
    assert e.register_memory(4096, 4096) == -1
    assert e.unregister_memory(4096) == -1
    assert e.batch_register_memory([4096], [10]) == -1
    assert e.batch_unregister_memory([4096]) == -1
    assert e.transfer_sync_write("127.0.0.1:1", 4096, 4096, 1) == -1
    assert e.batch_transfer_sync_read("127.0.0.1:1", [4096], [4096], [1]) == -1
    assert e.batch_transfer_async_write("127.0.0.1:1", [4096], [4096], [1]) == 0
    assert e.transfer_submit_write("127.0.0.1:1", 4096, 4096, 1) == 0
    assert e.get_batch_transfer_status([1]) == -1
    assert e.transfer_check_status(1) == -1
    assert e.allocate_managed_buffer(10) == 0
    assert e.free_managed_buffer(4096, 10) == -1
    assert e.get_first_buffer_address("127.0.0.1:1") == 0
    assert e.send_probe("127.0.0.1:1") == -1
    assert e.get_notifies() == []
    assert e.get_engine() is None and e.get_engine_ptr() == 0
    assert e.warmup_efa_segment("x") == 0
    assert "cpu:" in e.get_local_topology()
    err = capfd.readouterr().err
    assert err.count("call initialize() first") >= 14
