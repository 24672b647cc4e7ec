"""The module layout of upstream's wheel that programs import (upstream's
test_import_structure.py; vLLM, SGLang, LMCache and checkpoint-engine use mooncake.engine,
mooncake.store, mooncake.mooncake_config, mooncake.BufferPool)."""
import asyncio
import importlib
import subprocess
import sys

import pytest

from store_helpers import Master

# upstream 0.3.13's tensor methods that this package provides (the *_with_parallelism family
# and the CUDA-IPC *_into_cuda ones are not provided: see python/README.md)
TENSOR_METHODS = """
put_tensor get_tensor batch_put_tensor batch_get_tensor put_tensor_from batch_put_tensor_from
get_tensor_into batch_get_tensor_into put_tensor_with_tp get_tensor_with_tp
batch_put_tensor_with_tp batch_get_tensor_with_tp put_tensor_with_tp_from
batch_put_tensor_with_tp_from get_tensor_with_tp_into batch_get_tensor_with_tp_into
pub_tensor batch_pub_tensor pub_tensor_with_tp batch_pub_tensor_with_tp upsert_tensor
batch_upsert_tensor upsert_tensor_from batch_upsert_tensor_from upsert_pub_tensor
batch_upsert_pub_tensor save_tensor_to_safetensor load_tensor_from_safetensor
put_tensor_with_parallelism upsert_tensor_with_parallelism put_tensor_with_parallelism_from
upsert_tensor_with_parallelism_from batch_put_tensor_with_parallelism
batch_upsert_tensor_with_parallelism batch_put_tensor_with_parallelism_from
batch_upsert_tensor_with_parallelism_from get_tensor_with_parallelism
batch_get_tensor_with_parallelism get_tensor_with_parallelism_into
batch_get_tensor_with_parallelism_into
""".split()


def test_import_mooncake_does_not_load_the_extension():
    code = ("import sys, mooncake; assert 'mooncake.engine' not in sys.modules; "
            "from mooncake import BufferPool; assert BufferPool.__name__ == 'BufferPool'; "
            "print(mooncake.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def test_upstream_import_lines():
    import mooncake
    import mooncake.engine
    from mooncake.engine import TransferEngine, TransferOpcode  # noqa: F401
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: F401
    from mooncake.mooncake_config import (MooncakeConfig, DEFAULT_GLOBAL_SEGMENT_SIZE,  # noqa
                                          _parse_bool, _parse_segment_size)
    from mooncake import BufferPool, RegisteredBufferPool
    from mooncake.buffer_pool import BufferPool as BP
    from mooncake.async_store import MooncakeDistributedStoreAsync  # noqa: F401
    assert BufferPool is RegisteredBufferPool is BP
    assert MooncakeDistributedStore() is not None and ReplicateConfig() is not None
    for name in ("cli", "cli_bench", "cli_client"):
        assert callable(importlib.import_module(f"mooncake.{name}").main)
    with pytest.raises(AttributeError):
        mooncake.NoSuchThing  # noqa: B018


def test_tensor_method_names():
    from mooncake.store import MooncakeDistributedStore
    missing = [m for m in TENSOR_METHODS if not callable(getattr(MooncakeDistributedStore, m,
                                                                 None))]
    assert not missing


def test_methods_refuse_an_unset_store_without_crashing():
    torch = pytest.importorskip("torch")
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.put_tensor("k", torch.zeros(2)) < 0
    assert s.get_tensor("k") is None
    assert s.batch_get_tensor(["k"]) == [None]


def test_async_store(tmp_path):
    master = Master()
    try:
        from mooncake.async_store import MooncakeDistributedStoreAsync
        s = MooncakeDistributedStoreAsync()

        async def run():
            rc = await s.async_setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp",
                                     "", master.addr)
            assert rc == 0
            assert await s.async_put("k", b"v") == 0
            assert await s.async_get("k") == b"v"
            got = await asyncio.gather(*(s.async_is_exist("k") for _ in range(8)))
            assert got == [1] * 8
        asyncio.run(run())
        with pytest.raises(AttributeError):
            s.async_no_such_method  # noqa: B018
        with pytest.raises(AttributeError):
            s.no_such_attribute  # noqa: B018
        s.close()
    finally:
        master.stop()


def test_store_stub_lists_the_tensor_methods_as_they_are():
    import ast
    import inspect
    import pathlib
    import mooncake.store as store_mod
    stub = pathlib.Path(store_mod.__file__).with_name("store.pyi")
    tree = ast.parse(stub.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and
               n.name == "MooncakeDistributedStore")
    stubbed = {f.name: [a.arg for a in f.args.args[1:]] for f in cls.body
               if isinstance(f, ast.FunctionDef)}
    for name in TENSOR_METHODS:
        assert name in stubbed, f"store.pyi lacks {name}"
        params = list(inspect.signature(getattr(store_mod.MooncakeDistributedStore,
                                                name)).parameters)[1:]
        assert params == stubbed[name], name
