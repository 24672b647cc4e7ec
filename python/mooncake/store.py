"""Mooncake Store: a distributed KV-cache pool on the transfer engine (upstream-compatible).

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "", "127.0.0.1:50051")
    store.put("key", b"value")
    assert store.get("key") == b"value"

A `mooncake_master` must be running (installed beside this package). Conventions as upstream:
0 (or a count / size) on success, a negative error code on failure, b"" / None for a missing
key; putting an existing key returns 0 and keeps the stored value.

The tensor methods (put_tensor, get_tensor, their batch_ / _into / _from / _with_tp / pub_ /
upsert_ forms, safetensors export and import) store upstream's tensor object layout
([304-byte TensorMetadata][data], see mooncake/_tensor_layout.py), so tensors written by
upstream's client read back here and the other way round. The *_with_parallelism family
(ParallelAxis, TensorParallelism, ReadTarget) stores shards by their parallel identity, in
upstream's key names and shard manifest (mooncake/_parallel_spec.py).
"""
from .engine import _store
from ._store_tensor import TensorMethods
from ._store_tensor_read import TensorReadMethods, deserialize_tensor, serialize_tensor
from ._store_tensor_device import TensorDeviceReadMethods
from ._store_tensor_parallel import TensorParallelWriteMethods
from ._store_tensor_parallel_read import TensorParallelReadMethods
from ._parallel_spec import ParallelAxis, ReadTarget, TensorParallelism
from . import _tensor_layout

ReplicateConfig = _store.ReplicateConfig
SoftPinAction = _store.SoftPinAction
ObjectDataType = _store.ObjectDataType
BufferHandle = _store.BufferHandle
# The binding's other public names (enums, allocators) under their own names here too.
for _name in dir(_store):
    if not _name.startswith("_") and _name not in globals() and \
            _name != "MooncakeDistributedStore":
        globals()[_name] = getattr(_store, _name)
del _name


_DEFAULT_LOCAL_BUFFER = 16 << 20  # the binding's default local_buffer_size
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def _size_of(value):
    """An int size, or a string such as "16MB" (as setup's dict form takes); None if not."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        v = value.strip().upper()
        num = v.rstrip("BIKMGT")
        try:
            return int(float(num) * _UNITS[v[len(num):].strip()])
        except (ValueError, KeyError):
            return None
    return None


class MooncakeDistributedStore(TensorParallelWriteMethods, TensorParallelReadMethods,
                               TensorMethods, TensorReadMethods, TensorDeviceReadMethods,
                               _store.MooncakeDistributedStore):
    __doc__ = _store.MooncakeDistributedStore.__doc__

    _mc_local_buffer_size = None  # set by a successful setup(); BufferPool sizes from it

    def setup(self, *args, **kwargs):
        rc = super().setup(*args, **kwargs)
        if rc == 0:
            cfg = args[0] if args and isinstance(args[0], dict) else kwargs.get("config")
            if isinstance(cfg, dict):
                size = _size_of(cfg.get("local_buffer_size", _DEFAULT_LOCAL_BUFFER))
            elif len(args) > 3:
                size = _size_of(args[3])
            else:
                size = _size_of(kwargs.get("local_buffer_size", _DEFAULT_LOCAL_BUFFER))
            self._mc_local_buffer_size = _DEFAULT_LOCAL_BUFFER if size is None else size
        return rc
    setup.__doc__ = _store.MooncakeDistributedStore.setup.__doc__

    def close(self):
        self._mc_local_buffer_size = None
        return super().close()

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """upstream's init_all: setup with its fixed values: this host as "localhost:12345",
        the etcd metadata server at 127.0.0.1:2379, mount_segment_size bytes lent, 1 GiB of
        local buffer, the master at 127.0.0.1:50051. 0, or -600 when already set up, or
        setup's code."""
        if self._mc_local_buffer_size is not None:
            return -600
        return self.setup("localhost:12345", "127.0.0.1:2379", mount_segment_size, 1 << 30,
                          protocol, device_name, "127.0.0.1:50051")


def _serialize_tensor(tensor):
    """(metadata bytes, data pointer, data size, owner) of a torch tensor (upstream's name)."""
    return serialize_tensor(tensor)


def _tensor_metadata_size():
    """The size of the tensor metadata that precedes a tensor's data: 304."""
    return _tensor_layout.HEADER_SIZE


def _deserialize_tensor(payload):
    """The tensor of a tensor object's bytes (upstream's name); ValueError if it is not one."""
    return deserialize_tensor(payload)


from .buffer_pool import BufferPool, RegisteredBufferPool  # noqa: E402  (uses the class above)

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "BufferHandle", "BufferPool", "RegisteredBufferPool", "ParallelAxis",
           "TensorParallelism", "ReadTarget"]
