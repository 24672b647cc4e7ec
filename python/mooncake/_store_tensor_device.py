"""get_tensor_into_cuda and batch_get_tensor_into_cuda: a stored tensor's data read straight
into a tensor the caller allocated (a CUDA tensor, in upstream's use), with upstream's names,
arguments and return values: per key, the bytes read (the data part, without the 304-byte
header) or a negative code.

As upstream, the destination must be a contiguous torch tensor of the stored tensor's dtype and
local shape (-600 INVALID_PARAMS otherwise, with a log line saying which differs); its memory is
filled and nothing else is allocated. Two reads per call, as upstream: the headers of all keys
(into a small host buffer), then the data of those that match (into the tensors, registered
with the engine for the call as local-only memory, so device memory moves by device copies
and never through the CPU).

Beyond upstream: any client reads into CUDA memory (upstream's real client refuses: "CUDA IPC
tensor read requires a dummy client"; here a dummy runs a store client of its own), a missing
key gives its own code (-704 OBJECT_NOT_FOUND, where upstream says -600), and a host tensor is
filled as well (upstream refuses one that CUDA cannot export).
"""
from . import _tensor_layout as layout
from ._store_tensor import INVALID_PARAMS, _temp, _torch, log


def _destination(tensor, key, what):
    """(pointer, nbytes, dtype code, shape) of a destination tensor, or None with a log line."""
    try:
        torch = _torch()
    except ImportError:
        log.error("%s: torch is not installed", what)
        return None
    if not isinstance(tensor, torch.Tensor):
        log.error("%s: the destination for %r is not a torch.Tensor (%s)", what, key,
                  type(tensor).__name__)
        return None
    if not tensor.is_contiguous():
        log.error("%s: the destination tensor for %r must be contiguous", what, key)
        return None
    code = layout.dtype_code(tensor.dtype)
    if code is None:
        log.error("%s: unsupported destination dtype %s for %r", what, tensor.dtype, key)
        return None
    if tensor.dim() > layout.MAX_DIMS:
        log.error("%s: the destination for %r has %d dimensions, at most %d are supported",
                  what, key, tensor.dim(), layout.MAX_DIMS)
        return None
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), code, tuple(tensor.shape)


def _matches(dest, md, key, what):
    _, nbytes, code, shape = dest
    if md.dtype != code or tuple(md.local_shape) != shape or md.data_bytes != nbytes:
        log.error("%s: the destination tensor for %r does not match the stored tensor "
                  "(stored %s %s, %d bytes; destination %s %s, %d bytes)", what, key,
                  layout.DTYPES[md.dtype][0], list(md.local_shape), md.data_bytes,
                  layout.DTYPES[code][0], list(shape), nbytes)
        return False
    return True


class TensorDeviceReadMethods:
    """Mixed into MooncakeDistributedStore (store.py)."""

    def get_tensor_into_cuda(self, key, tensor):
        """Reads the data of the tensor stored under key into `tensor` (contiguous, of the
        stored dtype and shape): the bytes read, or a negative code."""
        results = self.batch_get_tensor_into_cuda([key], [tensor])
        return results[0] if results else INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys, tensors_list):
        """get_tensor_into_cuda for each key: a list of bytes read or negative codes (all
        -600 when keys and tensors_list differ in length)."""
        what = "batch_get_tensor_into_cuda"
        keys, tensors = list(keys), list(tensors_list)
        results = [INVALID_PARAMS] * len(keys)
        if len(keys) != len(tensors):
            log.error("%s: %d keys and %d tensors", what, len(keys), len(tensors))
            return results
        dests = {}
        for i, (k, t) in enumerate(zip(keys, tensors)):
            d = _destination(t, k, what)
            if d is not None:
                dests[i] = d
        if not dests:
            return results
        metadata = self._tensor_headers([keys[i] for i in dests], what)
        reads = []  # (index, pointer, nbytes, data offset)
        for i, md in zip(dests, metadata):
            if isinstance(md, int):
                results[i] = md
            elif _matches(dests[i], md, keys[i], what):
                if md.data_bytes == 0:
                    results[i] = 0
                else:
                    reads.append((i, dests[i][0], md.data_bytes, md.data_offset))
        if not reads:
            return results
        # Each destination registered (local-only) for the read; the same memory twice in one
        # batch is registered once. Destinations that overlap otherwise are refused (their
        # reads would race, and their registrations could not both be held).
        spans = {}
        for _, ptr, n, _ in reads:
            spans[ptr] = max(spans.get(ptr, 0), n)
        clash, end, end_owner = set(), 0, None
        for p, n in sorted(spans.items()):
            if p < end:
                clash.update((p, end_owner))
            if p + n > end:
                end, end_owner = p + n, p
        if clash:
            for i, ptr, _, _ in reads:
                if ptr in clash:
                    log.error("%s: the destination tensor for %r overlaps another one", what,
                              keys[i])
                    results[i] = INVALID_PARAMS
            reads = [r for r in reads if r[1] not in clash]
            spans = {p: n for p, n in spans.items() if p not in clash}
            if not reads:
                return results
        with _temp(self).hold(self, list(spans.items())):
            got = self.get_into_ranges([ptr for _, ptr, _, _ in reads],
                                       [[keys[i]] for i, _, _, _ in reads],
                                       [[[0]] for _ in reads],
                                       [[[off]] for _, _, _, off in reads],
                                       [[[n]] for _, _, n, _ in reads])
        for (i, _, n, _), r in zip(reads, got):
            rc = r[0][0] if r and r[0] else INVALID_PARAMS
            results[i] = n if rc == n else (rc if rc < 0 else INVALID_PARAMS)
        return results

    def _tensor_headers(self, keys, what):
        """Per key, its parsed tensor Metadata, or a negative code (the key's own, such as
        -704 for a missing key; -600 for an object that is not a tensor)."""
        import numpy as np
        size = layout.HEADER_SIZE
        scratch = np.zeros(size * len(keys), dtype=np.uint8)
        base = scratch.ctypes.data
        with _temp(self).hold(self, [(base, scratch.nbytes)]):
            got = self.get_into_ranges([base], [list(keys)],
                                       [[[j * size] for j in range(len(keys))]],
                                       [[[0] for _ in keys]], [[[size] for _ in keys]])
        out = []
        for j, k in enumerate(keys):
            rc = got[0][j][0] if got and j < len(got[0]) and got[0][j] else INVALID_PARAMS
            if rc != size:
                if rc >= 0 or rc == INVALID_PARAMS:
                    log.error("%s: the object of %r is not a tensor object", what, k)
                    rc = INVALID_PARAMS
                out.append(rc)
                continue
            md = layout.parse_prefix(scratch[j * size:(j + 1) * size].tobytes())
            if md is None:
                log.error("%s: the object of %r is not a tensor object", what, k)
                out.append(INVALID_PARAMS)
            else:
                out.append(md)
        return out
