"""Mooncake Store: a distributed KV-cache pool on the transfer engine (upstream-compatible).

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "", "127.0.0.1:50051")
    store.put("key", b"value")
    assert store.get("key") == b"value"

A `mooncake_master` must be running (installed beside this package). Conventions as upstream:
0 (or a count / size) on success, a negative error code on failure, b"" / None for a missing
key; putting an existing key returns 0 and keeps the stored value.
"""
import struct as _struct

from .engine import _store

ReplicateConfig = _store.ReplicateConfig
SoftPinAction = _store.SoftPinAction
ObjectDataType = _store.ObjectDataType
BufferHandle = _store.BufferHandle

_TENSOR_MAGIC = b"MCT1"


def _tensor_header(tensor):
    dtype = str(tensor.dtype).encode()
    shape = tuple(tensor.shape)
    return (_TENSOR_MAGIC + _struct.pack("<B", len(dtype)) + dtype +
            _struct.pack("<B", len(shape)) + _struct.pack("<%dq" % len(shape), *shape))


class MooncakeDistributedStore(_store.MooncakeDistributedStore):
    __doc__ = _store.MooncakeDistributedStore.__doc__

    def put_tensor(self, key, tensor, config=None):
        """Stores a torch tensor (dtype, shape and data; CPU memory, or copied to it).

        Returns 0 or a negative error code (-600 for an object that is not a tensor)."""
        try:
            import torch
        except ImportError:
            return -600
        if not isinstance(tensor, torch.Tensor):
            return -600
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        args = (key, _tensor_header(t), raw)
        return self.put_parts(*args) if config is None else self.put_parts(*args, config=config)

    def get_tensor(self, key):
        """The tensor stored with put_tensor, or None (missing key, or not a tensor)."""
        import torch
        data = self.get(key)
        if len(data) < 6 or data[:4] != _TENSOR_MAGIC:
            return None
        pos = 4
        (n,) = _struct.unpack_from("<B", data, pos)
        pos += 1
        name = data[pos:pos + n].decode()
        pos += n
        (ndim,) = _struct.unpack_from("<B", data, pos)
        pos += 1
        shape = _struct.unpack_from("<%dq" % ndim, data, pos)
        pos += 8 * ndim
        dtype = getattr(torch, name.split(".", 1)[-1], None)
        if not isinstance(dtype, torch.dtype):
            return None
        body = bytearray(data[pos:])
        if not body:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(body, dtype=torch.uint8).view(dtype).reshape(shape)


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "BufferHandle"]
