"""The reading half of the `*_with_parallelism` tensor family (upstream's store_py_parallel_
read.h semantics), by ReadTarget (None: as_stored):

- as_stored, no parallelism: get_tensor(key).
- full, no parallelism: the tensor reassembled from the writer_partition shards its
  "<key>__writer_manifest" names; without that manifest, get_tensor(key).
- shard: the object under the requested axes' name when its metadata names exactly those
  axes (for a lone TP axis, also the writer_partition shard of that rank); else, for a request with a TP axis, the requested TP shard cut from the stored shards
  (resharding: the stored TP size comes from "<key>__parallelism_manifest", else, for a lone
  TP axis, from "<key>_tp_0"'s metadata; for several axes, it is the requested one); else,
  for a lone TP axis, get_tensor("<key>_tp_<rank>").
- full with a TP axis: the whole tensor reassembled from the stored shards, as above.
- anything else (as_stored with parallelism, full without a TP axis): None.

Reads return a tensor or None (logged); batches a list with None for each failure. The
`_into` forms write [TensorMetadata][data] into the caller's buffer (any memory; registered
memory avoids staging) and return a tensor over it. Reassembly reads the stored shards whole
(one batch read) and copies the requested range out in Python; every shard's metadata must
agree with the manifest (dtype, shape, TP rank and size), or the read returns None.
"""
import ctypes

from . import _parallel_spec as spec
from . import _tensor_layout as layout
from ._store_tensor import _torch, log


def _shard_range(extent, rank, count):
    """Upstream's calculate_shard_range: (start, length) of shard `rank` of `count`."""
    return extent * rank // count, extent * (rank + 1) // count - extent * rank // count


class _Stored:
    """The shards of one tensor: the tensors in TP-rank order, the global shape, split_dim
    and the dtype code."""

    def __init__(self, tensors, global_shape, split_dim, code):
        self.tensors, self.global_shape = tensors, tuple(global_shape)
        self.split_dim, self.code = split_dim, code


class TensorParallelReadMethods:
    """Mixed into MooncakeDistributedStore (store.py)."""

    def _pr_read(self, keys):
        """[(tensor, metadata) or None] of the objects under keys (one batch read)."""
        out = []
        for h in self.batch_get_buffer(list(keys)):
            md = None if h is None else layout.parse_at(h.ptr(), h.size())
            out.append(None if md is None else
                       (layout.tensor_over(_torch(), md, h.ptr(), owner=h), md))
        return out

    def _pr_assemble(self, keys, count, global_shape, split_dim, code, tp_axes, what):
        """_Stored of the `count` shards under keys, checked against the expected layout:
        tp_axes(rank) is the canonical Axis list shard `rank` must carry (None: any TP-only
        axis of that rank and count). None (logged) on any mismatch."""
        got = self._pr_read(keys)
        extent = global_shape[split_dim] // count
        want_local = global_shape[:split_dim] + (extent,) + global_shape[split_dim + 1:]
        tensors = []
        for rank, (key, item) in enumerate(zip(keys, got)):
            if item is None:
                log.error("%s: shard %r is missing or not a tensor object", what, key)
                return None
            t, md = item
            stored = spec.axes_of_metadata(md)
            want = [a.key() for a in tp_axes(rank)]
            if stored is None or [a.key() for a in stored] != want or md.dtype != code or \
                    md.local_shape != want_local or md.global_shape != global_shape:
                log.error("%s: shard metadata mismatch for key %r", what, key)
                return None
            tensors.append(t)
        return _Stored(tensors, global_shape, split_dim, code)

    def _pr_sources(self, key, axes, what):
        """The stored shards of the tensor a TP-containing request names, or None."""
        canon = spec.canonical(axes)
        ti = spec.tp_index(canon)
        req = canon[ti]

        def names(count):
            def at(rank):
                a = list(canon)
                a[ti] = req.with_rank(rank, count)
                return a
            return at

        def uniform(shape, sd, count):
            ok = 0 <= sd < len(shape) and req.split_dim == sd and \
                shape[sd] % req.size == 0 and shape[sd] % count == 0
            if not ok:
                log.error("%s: split_dim mismatch or non-uniform sharding for %r", what, key)
            return ok

        man = spec.parse_manifest(self.get(spec.parallelism_manifest_key(key)) or None)
        if man is not None:
            code, shape, sd, count = man
            if not uniform(shape, sd, count):
                return None
            at = names(count)
            return self._pr_assemble([spec.shard_key(key, at(r)) for r in range(count)],
                                     count, shape, sd, code, at, what)
        if len(canon) == 1:  # a lone TP axis: the *_with_tp layout, sized by shard 0
            first = self._pr_read([key if req.size <= 1 else f"{key}_tp_0"])[0]
            stored = None if first is None else spec.axes_of_metadata(first[1])
            tp = None if not stored else next((a for a in stored if a.kind == "tp"), None)
            if tp is None or tp.split_dim is None:
                log.error("%s: no TP shard metadata for %r", what, key)
                return None
            md = first[1]
            if not uniform(md.global_shape, tp.split_dim, tp.size):
                return None
            at = names(tp.size)
            keys = [key if tp.size <= 1 else f"{key}_tp_{r}" for r in range(tp.size)]
            return self._pr_assemble(keys, tp.size, md.global_shape, tp.split_dim, md.dtype,
                                     at, what)
        at = names(req.size)
        keys = [spec.shard_key(key, at(r)) for r in range(req.size)]
        first = self._pr_read(keys[:1])[0]
        if first is None:
            log.error("%s: no shard matched the requested layout for %r", what, key)
            return None
        md = first[1]
        if not uniform(md.global_shape, req.split_dim, req.size):
            return None
        return self._pr_assemble(keys, req.size, md.global_shape, req.split_dim, md.dtype, at,
                                 what)

    def _pr_writer_sources(self, key, what):
        """The writer_partition shards of key, or None when it has no writer manifest."""
        man = spec.parse_manifest(self.get(spec.writer_manifest_key(key)) or None)
        if man is None:
            return None
        code, shape, sd, count = man
        if shape[sd] % count:
            log.error("%s: writer manifest of %r is not uniform", what, key)
            return False

        def at(rank):
            return [spec.Axis("tp", rank, count, sd, None, None)]
        keys = [spec.writer_key(key, r, count, sd) for r in range(count)]
        return self._pr_assemble(keys, count, shape, sd, code, at, what) or False

    @staticmethod
    def _pr_cut(stored, start, length):
        """The [start, start+length) range of the stored tensor along its split_dim."""
        torch = _torch()
        sd, count = stored.split_dim, len(stored.tensors)
        extent = stored.global_shape[sd] // count
        dtype = getattr(torch, layout.DTYPES[stored.code][0])
        shape = stored.global_shape[:sd] + (length,) + stored.global_shape[sd + 1:]
        if length == 0 or extent == 0:
            return torch.empty(shape, dtype=dtype)
        first, last = start // extent, (start + length - 1) // extent
        part = torch.cat(stored.tensors[first:last + 1], dim=sd) if last > first else \
            stored.tensors[first]
        return part.narrow(sd, start - first * extent, length).contiguous()

    def _pr_target(self, key, target, what):
        """(tensor, metadata) of a read target, or None. as_stored without parallelism is
        handled by the callers."""
        parsed = spec.parse_read_target(target, what)
        if parsed is None:
            return None
        mode, axes = parsed
        if mode == "full" and axes is None:
            stored = self._pr_writer_sources(key, what)
            if stored is False:
                return None
            if stored is not None:
                t = self._pr_cut(stored, 0, stored.global_shape[stored.split_dim])
                return t, layout.Metadata(stored.code, t.shape, t.shape,
                                          t.numel() * t.element_size())
            got = self._pr_read([key])[0]
            return got
        if axes is None:
            log.error("%s: parallelism is required for mode %r", what, mode)
            return None
        ti = spec.tp_index(axes)
        if mode == "shard":
            got = self._pr_read([spec.shard_key(key, axes)])[0]
            stored = None if got is None else spec.axes_of_metadata(got[1])
            if stored is not None and \
                    [a.key() for a in stored] == [a.key() for a in spec.canonical(axes)]:
                return got
            if len(axes) == 1 and ti is not None:  # a writer_partition shard of that rank
                a = axes[0]
                got = self._pr_read([spec.writer_key(key, a.rank, a.size, a.split_dim)])[0]
                stored = None if got is None else spec.axes_of_metadata(got[1])
                if stored is not None and [s.key() for s in stored] == [a.key()]:
                    return got
            if ti is not None:
                src = self._pr_sources(key, axes, what)
                if src is not None:
                    tp = axes[ti]
                    sd = src.split_dim
                    start, length = _shard_range(src.global_shape[sd], tp.rank, tp.size)
                    t = self._pr_cut(src, start, length)
                    md = spec.shard_metadata(src.code, src.global_shape, tuple(t.shape),
                                             t.numel() * t.element_size(), axes)
                    return t, md
                if len(axes) == 1:
                    rank, size = axes[0].rank, axes[0].size
                    return self._pr_read([key if size <= 1 else f"{key}_tp_{rank}"])[0]
            log.error("%s: parallelism metadata mismatch for key %r", what, key)
            return None
        if mode == "full" and ti is not None:
            src = self._pr_sources(key, axes, what)
            if src is None:
                return None
            t = self._pr_cut(src, 0, src.global_shape[src.split_dim])
            return t, layout.Metadata(src.code, t.shape, t.shape, t.numel() * t.element_size())
        log.error("%s: mode %r with this parallelism is not supported", what, mode)
        return None

    # ---- the public methods ----

    def get_tensor_with_parallelism(self, key, target=None):
        """The tensor a ReadTarget names (see the module docstring), or None."""
        if target is None:
            return self.get_tensor(key)
        got = self._pr_target(key, target, "get_tensor_with_parallelism")
        return None if got is None else got[0]

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        if targets is None:
            return self.batch_get_tensor(keys)
        keys = list(keys)
        if not isinstance(targets, (list, tuple)) or len(targets) != len(keys):
            log.error("batch_get_tensor_with_parallelism: targets must be a list as long as "
                      "keys")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """get_tensor_with_parallelism into the caller's buffer ([metadata][data]); a tensor
        over the buffer, or None (also when the result does not fit)."""
        what = "get_tensor_with_parallelism_into"
        if not buffer_ptr:
            log.error("%s: buffer pointer cannot be null", what)
            return None
        parsed = spec.parse_read_target(target, what)
        if parsed is None:
            return None
        if parsed == ("as_stored", None):
            return self.get_tensor_into(key, buffer_ptr, size)
        got = self._pr_target(key, target, what)
        if got is None:
            return None
        t, md = got
        total = layout.HEADER_SIZE + md.data_bytes
        if total > size:
            log.error("%s: buffer too small for key %r (%d < %d bytes)", what, key, size, total)
            return None
        ctypes.memmove(buffer_ptr, md.pack(), layout.HEADER_SIZE)
        if md.data_bytes:
            ctypes.memmove(buffer_ptr + layout.HEADER_SIZE, t.contiguous().data_ptr(),
                           md.data_bytes)
        return layout.tensor_over(_torch(), md, buffer_ptr)

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        keys, ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        what = "batch_get_tensor_with_parallelism_into"
        if not len(keys) == len(ptrs) == len(sizes):
            log.error("%s: keys, buffer_ptrs, and sizes must have the same length", what)
            return [None] * len(keys)
        if targets is None:
            targets = [None] * len(keys)
        elif not isinstance(targets, (list, tuple)) or len(targets) != len(keys):
            log.error("%s: targets must be a list as long as keys", what)
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, n, t)
                for k, p, n, t in zip(keys, ptrs, sizes, targets)]
