"""The tensor methods of MooncakeDistributedStore, in upstream Mooncake's object layout
(_tensor_layout.py), with upstream's names, arguments and return conventions:

- writes return 0 or a negative error code (-600 INVALID_PARAMS for something that is not a
  supported tensor, a bad shard request or mismatched batch lengths); batch writes a list;
- reads return a torch tensor, or None (missing key, failed read, not a tensor object);
  batch reads a list with None in place of each miss.

Copies: a put sends the 304-byte header and the tensor's own memory as two parts of one object
(batch_put_from_multi_buffers): no copy in Python. Memory registered with register_buffer
moves with no copy at all; other memory is staged through the client's local buffer by the
C++ client, unless the build can register local-only memory (register_buffer(...,
remote_accessible=False)): then tensors of 1 MiB or more are registered for the duration of
the call and move without staging, and get_tensor reads straight into the result's memory.
get_tensor_into returns a tensor over the caller's buffer. CUDA tensors are copied to the host
first (this package's Store lends host memory only).

Tensor parallelism (*_with_tp) follows upstream: a put stores every one of the tp_size shards,
whatever tp_rank says, under "<key>_tp_<rank>" (uniform shards only: the split dimension must
divide by tp_size); a get reads the shard of tp_rank. Shard objects carry SHARD metadata (the
full shape and the TP axis), as upstream writes them.
"""
import contextlib
import logging
import threading

from . import _tensor_layout as layout

log = logging.getLogger("mooncake.store")

INVALID_PARAMS = -600
INTERNAL_ERROR = -1
FILE_NOT_FOUND = -1100


def _torch():
    import torch
    return torch


def _tp_key(key, rank):
    return f"{key}_tp_{rank}"


def _as_host_tensor(tensor, what):
    """(contiguous CPU tensor, dtype code) or (None, None) with a log line."""
    try:
        torch = _torch()
    except ImportError:
        log.error("%s: torch is not installed", what)
        return None, None
    if not isinstance(tensor, torch.Tensor):
        log.error("%s: not a torch.Tensor (%s)", what, type(tensor).__name__)
        return None, None
    code = layout.dtype_code(tensor.dtype)
    if code is None:
        log.error("%s: unsupported tensor dtype %s", what, tensor.dtype)
        return None, None
    if tensor.dim() > layout.MAX_DIMS:
        log.error("%s: tensor has %d dimensions, at most %d are supported", what, tensor.dim(),
                  layout.MAX_DIMS)
        return None, None
    try:
        t = tensor.detach()
        if t.layout != torch.strided:
            log.error("%s: only dense (strided) tensors can be stored, not %s", what, t.layout)
            return None, None
        if t.device.type != "cpu":
            t = t.cpu()
        return t.resolve_neg().contiguous(), code
    except (RuntimeError, NotImplementedError) as e:  # e.g. a meta tensor has no data
        log.error("%s: cannot read the tensor's data: %s", what, e)
        return None, None


def _shards(tensor, code, tp_size, split_dim, what):
    """[(shard tensor, metadata)] for every TP rank, or None (logged) for a bad request."""
    shape = tuple(tensor.shape)
    if not 0 <= split_dim < len(shape) or tp_size <= 0:
        log.error("%s: invalid shard parameters (split_dim %d of a %d-d tensor, tp_size %d)",
                  what, split_dim, len(shape), tp_size)
        return None
    if shape[split_dim] % tp_size:
        log.error("%s: only uniform sharding is supported (dimension %d of size %d, tp_size "
                  "%d)", what, split_dim, shape[split_dim], tp_size)
        return None
    step = shape[split_dim] // tp_size
    out = []
    for rank in range(tp_size):
        shard = tensor.narrow(split_dim, rank * step, step).contiguous()
        out.append((shard, layout.shard_metadata(shape, shard, code, rank, tp_size, split_dim)))
    return out


class _Parts:
    """The parts of tensor objects to write: a header buffer and each tensor's memory."""

    def __init__(self):
        self.keys, self.headers, self.tensors = [], [], []

    def add(self, key, tensor, md):
        self.keys.append(key)
        self.headers.append(md.pack())
        self.tensors.append(tensor)

    def ptrs_sizes(self):
        import numpy as np
        self._hdr = np.frombuffer(b"".join(self.headers), dtype=np.uint8).copy()
        base = self._hdr.ctypes.data
        ptrs, sizes = [], []
        for i, t in enumerate(self.tensors):
            n = t.numel() * t.element_size()
            p, s = [base + i * layout.HEADER_SIZE], [layout.HEADER_SIZE]
            if n:
                p.append(t.data_ptr())
                s.append(n)
            ptrs.append(p)
            sizes.append(s)
        return ptrs, sizes


# Tensors at least this large are registered for the duration of a call (a registration costs
# tens of microseconds; staging 64 MiB through the local buffer costs milliseconds).
_REGISTER_MIN_BYTES = 1 << 20


def _register_local(store, ptr, size):
    """Registers [ptr, ptr+size) with the store's engine as local-only memory (not published
    to peers, like the client's staging buffer): 0, a negative code, or None when this build's
    register_buffer cannot register local-only. The temporary registrations below are made
    only that way: a remote-accessible one would open the caller's tensor to peers for the
    call and republish the segment descriptor (a metadata-store write) twice per call."""
    if store.__dict__.get("_mc_no_local_register"):
        return None
    try:
        return store.register_buffer(ptr, size, remote_accessible=False)
    except TypeError:  # no such keyword: stage through the local buffer instead
        store.__dict__["_mc_no_local_register"] = True
        return None


class _TempRegistrations:
    """Memory registered with a store for the duration of calls, shared by the threads that
    use it: a range another call registered is reused (counted) rather than unregistered under
    it; a range that overlaps one only in part waits until that one is gone."""

    def __init__(self):
        self._cv = threading.Condition()
        self._live = {}  # start -> [end, count]

    def _find(self, start, end):
        for s, (e, _) in self._live.items():
            if s < end and start < e:
                return s
        return None

    @contextlib.contextmanager
    def hold(self, store, ranges):
        """Registers (or shares) each (ptr, size) range while the block runs; a range that
        cannot be registered (e.g. inside memory the caller registered) is left as it is."""
        held = []
        try:
            for ptr, size in ranges:
                end = ptr + size
                with self._cv:
                    while True:
                        s = self._find(ptr, end)
                        if s is None or (s <= ptr and end <= self._live[s][0]):
                            break
                        self._cv.wait()
                    if s is not None:
                        self._live[s][1] += 1
                        held.append(s)
                        continue
                    if _register_local(store, ptr, size) == 0:
                        self._live[ptr] = [end, 1]
                        held.append(ptr)
            yield
        finally:
            with self._cv:
                for s in held:
                    entry = self._live[s]
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._live[s]
                        store.unregister_buffer(s)
                self._cv.notify_all()


def _temp(store):
    reg = store.__dict__.get("_mc_temp_registrations")
    if reg is None:
        reg = store.__dict__.setdefault("_mc_temp_registrations", _TempRegistrations())
    return reg


def _first_error(codes):
    for c in codes:
        if c != 0:
            return c
    return 0


class TensorMethods:
    """The writing half, mixed into MooncakeDistributedStore (store.py) with
    _store_tensor_read.TensorReadMethods."""

    # ---- writing ----

    def _write_parts(self, parts, config, upsert):
        if not parts.keys:
            return []
        ptrs, sizes = parts.ptrs_sizes()
        if not upsert:
            big = [(p[1], n[1]) for p, n in zip(ptrs, sizes)
                   if len(n) > 1 and n[1] >= _REGISTER_MIN_BYTES]
            with _temp(self).hold(self, big):
                return list(self.batch_put_from_multi_buffers(parts.keys, ptrs, sizes,
                                                              config=self._cfg(config)))
        if hasattr(self, "batch_upsert_from_multi_buffers"):
            return list(self.batch_upsert_from_multi_buffers(parts.keys, ptrs, sizes,
                                                             config=self._cfg(config)))
        if not hasattr(self, "upsert_parts"):
            log.error("upsert: this build of the Store has no upsert primitive")
            return [INTERNAL_ERROR] * len(parts.keys)
        # upsert_parts takes one object per call (header, then the tensor's memory).
        out = []
        for key, header, t in zip(parts.keys, parts.headers, parts.tensors):
            data = [t.reshape(-1).view(_torch().uint8).numpy()] if t.numel() else []
            out.append(self.upsert_parts(key, header, *data, config=self._cfg(config)))
        return out

    def _cfg(self, config):
        # The binding's class (mooncake.store re-exports it): no import of .store, which
        # imports this module.
        from .engine import _store
        return _store.ReplicateConfig() if config is None else config

    def _put_tensors(self, keys, tensors, config, upsert, what):
        """Per-key codes for writing full tensors."""
        if len(keys) != len(tensors):
            log.error("%s: %d keys but %d tensors", what, len(keys), len(tensors))
            return [INVALID_PARAMS] * len(keys)
        codes = [INVALID_PARAMS] * len(keys)
        parts, index = _Parts(), []
        for i, (key, tensor) in enumerate(zip(keys, tensors)):
            t, code = _as_host_tensor(tensor, f"{what} {key!r}")
            if t is None:
                continue
            parts.add(key, t, layout.full_metadata(t, code))
            index.append(i)
        for i, c in zip(index, self._write_parts(parts, config, upsert)):
            codes[i] = c
        return codes

    def _put_tensors_tp(self, base_keys, tensors, config, tp_size, split_dim, upsert, what):
        """Per-base-key codes for writing every TP shard of full tensors."""
        if len(base_keys) != len(tensors):
            log.error("%s: %d keys but %d tensors", what, len(base_keys), len(tensors))
            return [INVALID_PARAMS] * len(base_keys)
        codes = [INVALID_PARAMS] * len(base_keys)
        parts, index = _Parts(), []
        for i, (key, tensor) in enumerate(zip(base_keys, tensors)):
            t, code = _as_host_tensor(tensor, f"{what} {key!r}")
            if t is None:
                continue
            shards = _shards(t, code, tp_size, split_dim, f"{what} {key!r}")
            if shards is None:
                continue
            for rank, (shard, md) in enumerate(shards):
                parts.add(_tp_key(key, rank), shard, md)
            index.append(i)
        results = self._write_parts(parts, config, upsert)
        for n, i in enumerate(index):
            codes[i] = _first_error(results[n * tp_size:(n + 1) * tp_size])
        return codes

    @staticmethod
    def _check_config(config):
        if config is not None and config.preferred_segments and \
                len(config.preferred_segments) != config.replica_num:
            log.error("preferred_segments (%d) must match replica_num (%d)",
                      len(config.preferred_segments), config.replica_num)
            return INVALID_PARAMS
        return 0

    def put_tensor(self, key, tensor, config=None):
        """Stores a torch tensor as [TensorMetadata][data] (upstream's layout). 0 or a
        negative code (-600 for something that is not a supported tensor)."""
        return self._put_tensors([key], [tensor], config, False, "put_tensor")[0]

    def batch_put_tensor(self, keys, tensors_list, config=None):
        """put_tensor for each key with one master round trip; a list of codes."""
        if not keys:
            return []
        return self._put_tensors(list(keys), list(tensors_list), config, False,
                                 "batch_put_tensor")

    def pub_tensor(self, key, tensor, config=None):
        """put_tensor with a ReplicateConfig (replica_num, pins, preferred segments)."""
        return self._check_config(config) or self.put_tensor(key, tensor, config)

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        if self._check_config(config):
            return [INVALID_PARAMS] * len(keys)
        return self.batch_put_tensor(keys, tensors_list, config)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0, config=None):
        """Stores all tp_size shards of `tensor` (split along split_dim) under
        "<key>_tp_<rank>"; tp_rank is not used (as upstream). tp_size <= 1: put_tensor."""
        if tp_size <= 1:
            return self.put_tensor(key, tensor, config)
        return self._put_tensors_tp([key], [tensor], config, tp_size, split_dim, False,
                                    "put_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0, config=None):
        if tp_size <= 1:
            return self.batch_put_tensor(base_keys, tensors_list, config)
        if not base_keys:
            return []
        return self._put_tensors_tp(list(base_keys), list(tensors_list), config, tp_size,
                                    split_dim, False, "batch_put_tensor_with_tp")

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return self._check_config(config) or self.put_tensor_with_tp(
            key, tensor, tp_rank, tp_size, split_dim, config)

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        if self._check_config(config):
            return [INVALID_PARAMS] * len(base_keys)
        return self.batch_put_tensor_with_tp(base_keys, tensors_list, tp_rank, tp_size,
                                             split_dim, config)

    # ---- writing from a caller's buffer holding [TensorMetadata][data] ----

    def _checked_buffers(self, keys, ptrs, sizes, what):
        if not (len(keys) == len(ptrs) == len(sizes)):
            log.error("%s: keys, buffer_ptrs and sizes differ in length", what)
            return False
        for i, (p, n) in enumerate(zip(ptrs, sizes)):
            if layout.parse_at(p, n) is None:
                log.error("%s: buffer %d does not hold a valid tensor object (metadata, then "
                          "exactly its data)", what, i)
                return False
        return True

    def put_tensor_from(self, key, buffer_ptr, size):
        """Stores the tensor object at buffer_ptr (size bytes: metadata then data, as
        get_tensor_into leaves it); zero copy when the buffer is registered."""
        if not self._checked_buffers([key], [buffer_ptr], [size], "put_tensor_from"):
            return INVALID_PARAMS
        return self.put_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        if not keys:
            return []
        if not self._checked_buffers(keys, buffer_ptrs, sizes, "batch_put_tensor_from"):
            return [INVALID_PARAMS] * len(keys)
        return list(self.batch_put_from(list(keys), list(buffer_ptrs), list(sizes)))

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        """put_tensor_with_tp of the tensor object held at buffer_ptr."""
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        t = self._tensor_at(buffer_ptr, size, "put_tensor_with_tp_from")
        if t is None:
            return INVALID_PARAMS
        return self.put_tensor_with_tp(key, t, tp_rank, tp_size, split_dim)

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        if not (len(base_keys) == len(buffer_ptrs) == len(sizes)) or not base_keys:
            return [INVALID_PARAMS] * len(base_keys)
        codes = [INVALID_PARAMS] * len(base_keys)
        keys, tensors, index = [], [], []
        for i, (k, p, n) in enumerate(zip(base_keys, buffer_ptrs, sizes)):
            t = self._tensor_at(p, n, "batch_put_tensor_with_tp_from")
            if t is not None:
                keys.append(k)
                tensors.append(t)
                index.append(i)
        if keys:
            for i, c in zip(index, self.batch_put_tensor_with_tp(keys, tensors, tp_rank,
                                                                 tp_size, split_dim)):
                codes[i] = c
        return codes

    # ---- upsert (insert or replace) ----

    def upsert_tensor(self, key, tensor, config=None):
        """put_tensor that replaces an existing object."""
        return self._put_tensors([key], [tensor], config, True, "upsert_tensor")[0]

    def batch_upsert_tensor(self, keys, tensors_list, config=None):
        if not keys:
            return []
        return self._put_tensors(list(keys), list(tensors_list), config, True,
                                 "batch_upsert_tensor")

    def upsert_pub_tensor(self, key, tensor, config=None):
        return self._check_config(config) or self.upsert_tensor(key, tensor, config)

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        if self._check_config(config):
            return [INVALID_PARAMS] * len(keys)
        return self.batch_upsert_tensor(keys, tensors_list, config)

    def upsert_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0,
                              config=None):
        if tp_size <= 1:
            return self.upsert_tensor(key, tensor, config)
        return self._put_tensors_tp([key], [tensor], config, tp_size, split_dim, True,
                                    "upsert_tensor_with_tp")[0]

    def batch_upsert_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                    split_dim=0, config=None):
        if tp_size <= 1:
            return self.batch_upsert_tensor(base_keys, tensors_list, config)
        if not base_keys:
            return []
        return self._put_tensors_tp(list(base_keys), list(tensors_list), config, tp_size,
                                    split_dim, True, "batch_upsert_tensor_with_tp")

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return self.batch_upsert_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        if not keys:
            return []
        if not self._checked_buffers(keys, buffer_ptrs, sizes, "batch_upsert_tensor_from"):
            return [INVALID_PARAMS] * len(keys)
        if hasattr(self, "batch_upsert_from"):
            return list(self.batch_upsert_from(list(keys), list(buffer_ptrs), list(sizes)))
        if hasattr(self, "upsert_from"):
            return [self.upsert_from(k, p, n) for k, p, n in zip(keys, buffer_ptrs, sizes)]
        log.error("upsert: this build of the Store has no upsert primitive")
        return [INTERNAL_ERROR] * len(keys)
