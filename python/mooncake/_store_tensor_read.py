"""The reading half of MooncakeDistributedStore's tensor methods (_store_tensor.py has the
writing half and the conventions): get_tensor and its batch_ / _into / _with_tp forms,
safetensors export and import, and upstream's _serialize_tensor / _deserialize_tensor."""
from . import _tensor_layout as layout
from ._store_tensor import (FILE_NOT_FOUND, INVALID_PARAMS, _REGISTER_MIN_BYTES, _as_host_tensor,
                            _register_local, _torch, _tp_key, log)


class TensorReadMethods:
    """Mixed into MooncakeDistributedStore (store.py)."""

    def _tensor_at(self, ptr, size, what):
        md = layout.parse_at(ptr, size)
        if md is None:
            log.error("%s: the buffer does not hold a valid tensor object", what)
            return None
        return layout.tensor_over(_torch(), md, ptr)

    def _tensor_of_handle(self, key, handle):
        if handle is None:
            return None
        md = layout.parse_at(handle.ptr(), handle.size())
        if md is None:
            log.error("get_tensor: the object of %r is not a tensor object", key)
            return None
        return layout.tensor_over(_torch(), md, handle.ptr(), owner=handle)

    def get_tensor(self, key):
        """The tensor stored under key (its local shape: the shard for a TP shard key), or
        None. The object is read straight into the tensor's memory (registered for the read):
        no copy after the transfer."""
        if self.__dict__.get("_mc_no_local_register"):
            return self._tensor_of_handle(key, self.get_buffer(key))
        size = self.get_size(key)
        if size < 0:
            return None
        if size < _REGISTER_MIN_BYTES:
            return self._tensor_of_handle(key, self.get_buffer(key))
        torch = _torch()
        for _ in range(2):  # once more if the object grew between get_size and the read
            try:
                dst = torch.empty(size, dtype=torch.uint8)
            except RuntimeError as e:  # out of memory
                log.error("get_tensor: cannot allocate %d bytes for %r: %s", size, key, e)
                return None
            ptr = dst.data_ptr()
            if _register_local(self, ptr, size) != 0:  # unsupported, or a stale registration
                return self._tensor_of_handle(key, self.get_buffer(key))
            try:
                n = self.get_into(key, ptr, size)
            finally:
                self.unregister_buffer(ptr)
            if n >= 0:
                md = layout.parse_at(ptr, n)
                if md is None:
                    log.error("get_tensor: the object of %r is not a tensor object", key)
                    return None
                data = dst[md.data_offset:md.data_offset + md.data_bytes]
                return data.view(md.torch_dtype(torch)).reshape(md.local_shape)
            size = self.get_size(key)
            if size < 0:
                return None
        return None

    def batch_get_tensor(self, keys):
        """get_tensor for each key with one master round trip; None for each miss."""
        if not keys:
            return []
        return [self._tensor_of_handle(k, h)
                for k, h in zip(keys, self.batch_get_buffer(list(keys)))]

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """The shard of tp_rank ("<key>_tp_<tp_rank>"); tp_size <= 1: get_tensor(key)."""
        return self.get_tensor(key if tp_size <= 1 else _tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([_tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads the object of key into the caller's buffer (zero copy when registered) and
        returns a tensor over its data part (valid while the buffer is), or None."""
        if not buffer_ptr:
            log.error("get_tensor_into: buffer pointer cannot be null")
            return None
        n = self.get_into(key, buffer_ptr, size)
        if n < 0:
            return None
        return self._tensor_at(buffer_ptr, n, "get_tensor_into")

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        """get_tensor_into for each key with one master round trip: a list of tensors (None
        for each miss); a list of -600 when the arguments are inconsistent (as upstream)."""
        if not (len(keys) == len(buffer_ptrs) == len(sizes)) or not all(buffer_ptrs):
            log.error("batch_get_tensor_into: keys, buffer_ptrs and sizes differ in length, "
                      "or a pointer is null")
            return [INVALID_PARAMS] * len(keys)
        if not keys:
            return []
        lengths = self.batch_get_into(list(keys), list(buffer_ptrs), list(sizes))
        return [None if n < 0 else self._tensor_at(p, n, "batch_get_tensor_into")
                for p, n in zip(buffer_ptrs, lengths)]

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else _tp_key(key, tp_rank),
                                    buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1):
        keys = base_keys if tp_size <= 1 else [_tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # ---- safetensors files ----

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Writes the tensor of key into a safetensors file (named key unless file_name is
        given) under the name key. 0; -1100 when key holds no tensor; -600 when the file
        cannot be written."""
        t = self.get_tensor(key)
        if t is None:
            log.error("save_tensor_to_safetensor: no tensor for key %r", key)
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file
            save_file({key: t.contiguous()}, key if file_name is None else file_name)
        except Exception as e:  # safetensors missing, or an OS error
            log.error("save_tensor_to_safetensor: %s", e)
            return INVALID_PARAMS
        return 0

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """Reads a tensor from a safetensors file and put_tensor()s it under key (file_name
        when key is None). Takes the file's tensor named key, else its first one (logged).
        Returns the tensor, or None."""
        if file_name is None:
            log.error("load_tensor_from_safetensor: file_name is required")
            return None
        try:
            from safetensors.torch import load_file
            loaded = load_file(file_name)
        except Exception as e:
            log.error("load_tensor_from_safetensor: cannot read %s: %s", file_name, e)
            return None
        if not loaded:
            log.error("load_tensor_from_safetensor: no tensors in %s", file_name)
            return None
        store_key = file_name if key is None else key
        if key is not None and key in loaded:
            t = loaded[key]
        else:
            if key is not None:
                log.warning("load_tensor_from_safetensor: %r not in %s; using its first "
                            "tensor", key, file_name)
            t = next(iter(loaded.values()))
        rc = self.put_tensor(store_key, t)
        if rc != 0:
            log.error("load_tensor_from_safetensor: put_tensor(%r) failed: %d", store_key, rc)
            return None
        return t


def serialize_tensor(tensor):
    """(metadata bytes, data pointer, data size, owner) of a tensor, as upstream's
    mooncake.store._serialize_tensor; ValueError for an unsupported tensor."""
    t, code = _as_host_tensor(tensor, "_serialize_tensor")
    if t is None:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    md = layout.full_metadata(t, code)
    return md.pack(), t.data_ptr(), md.data_bytes, t


def deserialize_tensor(payload):
    """The tensor of an object's bytes (metadata then data), as upstream's
    mooncake.store._deserialize_tensor; ValueError when they are not a tensor object."""
    import numpy as np
    arr = np.frombuffer(bytes(payload), dtype=np.uint8).copy()
    md = layout.parse(arr, arr.nbytes)
    if md is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return layout.tensor_over(_torch(), md, arr.ctypes.data, owner=arr)
