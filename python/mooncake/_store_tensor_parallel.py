"""The writing half of the `*_with_parallelism` tensor family (upstream's store_py_parallel_
write.h semantics; _parallel_spec.py has the request types, key names and manifest layout;
_store_tensor_parallel_read.py the reads).

Routes of a write, by its arguments (parallelism and writer_partition together: -600):

- neither: the full tensor under key, as put_tensor / upsert_tensor (the `_from` forms as
  put_tensor_from, or put_from with a non-default config).
- writer_partition (rank, size, split_dim): `tensor` is the full tensor; shard `rank` is
  stored under "<key>__writer_<rank>of<size>_sd<d>" plus the manifest "<key>__writer_manifest".
- parallelism with one TP axis only: `tensor` is this rank's shard; the global shape is
  inferred (split_dim's extent times size); stored under "<key>_tp_<rank>" plus the manifest
  "<key>__parallelism_manifest".
- parallelism with a TP axis and others: `tensor` is the full tensor; the TP rank's shard is
  stored under the axes' name plus the manifest.
- parallelism without a TP axis: `tensor` is stored as it is, with SHARD metadata naming the
  axes, under the axes' name; no manifest.
- the `_from` forms with a TP axis take a full tensor object and store every TP rank's
  shard under its name, with no manifest (as upstream).

Returns: 0 or a negative code (-600 for a bad request or tensor); batches a list. A batch
with `parallelisms` / `writer_partitions` (a list as long as keys; None items take the full
route) writes key by key; group_ids in the config must name one group per key.
"""
from . import _parallel_spec as spec
from . import _tensor_layout as layout
from ._store_tensor import INVALID_PARAMS, _Parts, _as_host_tensor, _first_error, log


def _key_configs(config, n, what):
    """One config per key (group_ids split as upstream's ForSingleKey), or None (logged)."""
    groups = None if config is None else getattr(config, "group_ids", None)
    if not groups:
        return [config] * n
    if len(groups) != n:
        log.error("%s: group_ids must name one group per key (%d for %d keys)", what,
                  len(groups), n)
        return None
    out = []
    for g in groups:
        c = type(config)()
        for name in dir(config):
            if not name.startswith("_") and name != "group_ids":
                try:
                    setattr(c, name, getattr(config, name))
                except (AttributeError, TypeError):
                    pass
        c.group_ids = [g]
        out.append(c)
    return out


def _full_of_buffer(store, ptr, size, what):
    """The tensor of a full tensor object at ptr (global shape == local shape), or None."""
    md = layout.parse_at(ptr, size)
    if md is None or md.global_shape != md.local_shape:
        log.error("%s: the buffer does not hold a valid full tensor object", what)
        return None
    return store._tensor_at(ptr, size, what)


class TensorParallelWriteMethods:
    """Mixed into MooncakeDistributedStore (store.py)."""

    # ---- one key ----

    def _pw_write(self, objects, manifest, config, upsert):
        """Writes (key, tensor, metadata) objects, then (key, bytes) of a manifest: a code."""
        parts = _Parts()
        for key, t, md in objects:
            parts.add(key, t, md)
        rc = _first_error(self._write_parts(parts, config, upsert))
        if rc or manifest is None:
            return rc
        mkey, raw = manifest
        write = self.upsert if upsert else self.put
        return write(mkey, raw, config=self._cfg(config))

    def _pw_route(self, key, tensor, parallelism, writer, config, upsert, what):
        if parallelism is not None and writer is not None:
            log.error("%s: writer_partition cannot be combined with parallelism", what)
            return INVALID_PARAMS
        if self._check_config(config):
            return INVALID_PARAMS
        if parallelism is None and writer is None:
            return self._put_tensors([key], [tensor], config, upsert, what)[0]
        t, code = _as_host_tensor(tensor, f"{what} {key!r}")
        if t is None:
            return INVALID_PARAMS
        if writer is not None:
            w = spec.parse_writer_partition(writer, what)
            return INVALID_PARAMS if w is None else self._pw_writer(key, t, code, w, config,
                                                                    upsert, what)
        axes = spec.parse_parallelism(parallelism, what)
        if axes is None:
            return INVALID_PARAMS
        ti = spec.tp_index(axes)
        if ti is None:
            md = spec.shard_metadata(code, t.shape, t.shape, t.numel() * t.element_size(), axes)
            return self._pw_write([(spec.shard_key(key, axes), t, md)], None, config, upsert)
        tp = axes[ti]
        shape = tuple(t.shape)
        if not tp.split_dim < len(shape):
            log.error("%s: split_dim %d out of range for a %d-d tensor", what, tp.split_dim,
                      len(shape))
            return INVALID_PARAMS
        if len(axes) == 1:  # the caller's own shard: infer the global shape
            shard = t
            full_shape = shape[:tp.split_dim] + (shape[tp.split_dim] * tp.size,) + \
                shape[tp.split_dim + 1:]
        else:               # a full tensor: store the TP rank's uniform shard
            if shape[tp.split_dim] % tp.size:
                log.error("%s: only uniform sharding is supported", what)
                return INVALID_PARAMS
            step = shape[tp.split_dim] // tp.size
            shard = t.narrow(tp.split_dim, tp.rank * step, step).contiguous()
            full_shape = shape
        md = spec.shard_metadata(code, full_shape, tuple(shard.shape),
                                 shard.numel() * shard.element_size(), axes)
        manifest = (spec.parallelism_manifest_key(key),
                    spec.pack_manifest(code, full_shape, tp.split_dim, tp.size))
        return self._pw_write([(spec.shard_key(key, axes), shard, md)], manifest, config,
                              upsert)

    def _pw_writer(self, key, t, code, w, config, upsert, what):
        rank, size, split_dim = w
        shape = tuple(t.shape)
        if split_dim >= len(shape) or shape[split_dim] % size:
            log.error("%s: writer partition split_dim %d of a %d-d tensor must exist and "
                      "divide evenly by %d", what, split_dim, len(shape), size)
            return INVALID_PARAMS
        step = shape[split_dim] // size
        shard = t.narrow(split_dim, rank * step, step).contiguous()
        axis = spec.Axis("tp", rank, size, split_dim, None, None)
        md = spec.shard_metadata(code, shape, tuple(shard.shape),
                                 shard.numel() * shard.element_size(), [axis])
        manifest = (spec.writer_manifest_key(key),
                    spec.pack_manifest(code, shape, split_dim, size))
        return self._pw_write([(spec.writer_key(key, rank, size, split_dim), shard, md)],
                              manifest, config, upsert)

    def _pw_route_from(self, key, ptr, size, parallelism, writer, config, upsert, what):
        if parallelism is not None and writer is not None:
            log.error("%s: writer_partition cannot be combined with parallelism", what)
            return INVALID_PARAMS
        if parallelism is None and writer is None:
            if config is None:
                return (self.upsert_tensor_from if upsert else self.put_tensor_from)(
                    key, ptr, size)
            if self._check_config(config) or \
                    not self._checked_buffers([key], [ptr], [size], what):
                return INVALID_PARAMS
            return (self.upsert_from if upsert else self.put_from)(key, ptr, size,
                                                                   config=config)
        if writer is not None:
            t = _full_of_buffer(self, ptr, size, what)
            return INVALID_PARAMS if t is None else self._pw_route(
                key, t, None, writer, config, upsert, what)
        axes = spec.parse_parallelism(parallelism, what)
        md = layout.parse_at(ptr, size)
        if axes is None or md is None:
            if md is None:
                log.error("%s: the buffer does not hold a valid tensor object", what)
            return INVALID_PARAMS
        if self._check_config(config):
            return INVALID_PARAMS
        ti = spec.tp_index(axes)
        if ti is None:
            t = self._tensor_at(ptr, size, what)
            smd = spec.shard_metadata(md.dtype, md.global_shape, md.local_shape,
                                      md.data_bytes, axes)
            if smd is None:
                return INVALID_PARAMS
            return self._pw_write([(spec.shard_key(key, axes), t, smd)], None, config, upsert)
        t = _full_of_buffer(self, ptr, size, what)
        tp = axes[ti]
        if t is None or tp.split_dim >= t.dim() or t.shape[tp.split_dim] % tp.size:
            if t is not None:
                log.error("%s: only uniform sharding is supported", what)
            return INVALID_PARAMS
        step = t.shape[tp.split_dim] // tp.size
        objects = []
        for rank in range(tp.size):
            shard_axes = list(axes)
            shard_axes[ti] = tp.with_rank(rank)
            shard = t.narrow(tp.split_dim, rank * step, step).contiguous()
            smd = spec.shard_metadata(md.dtype, md.global_shape, tuple(shard.shape),
                                      shard.numel() * shard.element_size(), shard_axes)
            objects.append((spec.shard_key(key, shard_axes), shard, smd))
        return self._pw_write(objects, None, config, upsert)

    # ---- batches ----

    def _pw_batch(self, keys, n_values, requests, writers, config, direct, single, what):
        keys = list(keys)
        if requests is not None and writers is not None:
            log.error("%s: writer_partitions cannot be combined with parallelisms", what)
            return [INVALID_PARAMS] * len(keys)
        configs = _key_configs(config, len(keys), what)
        if configs is None:
            return [INVALID_PARAMS] * len(keys)
        if n_values != len(keys):
            log.error("%s: values and keys must have the same length", what)
            return [INVALID_PARAMS] * len(keys)
        if requests is None and writers is None:
            return direct() if keys else []
        items = requests if writers is None else writers
        if not isinstance(items, (list, tuple)) or len(items) != len(keys):
            log.error("%s: %s must be a list as long as keys", what,
                      "parallelisms" if writers is None else "writer_partitions")
            return [INVALID_PARAMS] * len(keys)
        return [single(i, items[i] if writers is None else None,
                       None if writers is None else items[i], configs[i])
                for i in range(len(keys))]

    # ---- the public methods ----

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        """Stores a tensor by its parallel identity (see the module docstring). 0 or a code."""
        return self._pw_route(key, tensor, parallelism, writer_partition, config, False,
                              "put_tensor_with_parallelism")

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        """put_tensor_with_parallelism that replaces existing objects."""
        return self._pw_route(key, tensor, parallelism, writer_partition, config, True,
                              "upsert_tensor_with_parallelism")

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None):
        """put_tensor_with_parallelism of the tensor object at buffer_ptr (metadata, then
        data, as put_tensor_from takes)."""
        return self._pw_route_from(key, buffer_ptr, size, parallelism, writer_partition,
                                   config, False, "put_tensor_with_parallelism_from")

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None):
        return self._pw_route_from(key, buffer_ptr, size, parallelism, writer_partition,
                                   config, True, "upsert_tensor_with_parallelism_from")

    def _pw_batch_tensors(self, keys, tensors_list, parallelisms, config, writer_partitions,
                          upsert, what):
        tensors = list(tensors_list)
        return self._pw_batch(
            keys, len(tensors), parallelisms, writer_partitions, config,
            lambda: ([INVALID_PARAMS] * len(keys) if self._check_config(config) else
                     self._put_tensors(list(keys), tensors, config, upsert, what)),
            lambda i, p, w, c: self._pw_route(keys[i], tensors[i], p, w, c, upsert, what),
            what)

    def _pw_batch_from(self, keys, buffer_ptrs, sizes, parallelisms, config,
                       writer_partitions, upsert, what):
        ptrs, sizes = list(buffer_ptrs), list(sizes)

        def direct():
            if len(sizes) != len(ptrs):
                return [INVALID_PARAMS] * len(keys)
            if config is None:
                return (self.batch_upsert_tensor_from if upsert else
                        self.batch_put_tensor_from)(keys, ptrs, sizes)
            if self._check_config(config) or \
                    not self._checked_buffers(keys, ptrs, sizes, what):
                return [INVALID_PARAMS] * len(keys)
            return list((self.batch_upsert_from if upsert else self.batch_put_from)(
                list(keys), ptrs, sizes, config=config))

        if len(sizes) != len(ptrs):
            log.error("%s: buffer_ptrs and sizes differ in length", what)
            return [INVALID_PARAMS] * len(keys)
        return self._pw_batch(
            keys, len(ptrs), parallelisms, writer_partitions, config, direct,
            lambda i, p, w, c: self._pw_route_from(keys[i], ptrs[i], sizes[i], p, w, c,
                                                   upsert, what),
            what)

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None):
        return self._pw_batch_tensors(keys, tensors_list, parallelisms, config,
                                      writer_partitions, False,
                                      "batch_put_tensor_with_parallelism")

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None):
        return self._pw_batch_tensors(keys, tensors_list, parallelisms, config,
                                      writer_partitions, True,
                                      "batch_upsert_tensor_with_parallelism")

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                               parallelisms=None, config=None,
                                               writer_partitions=None):
        return self._pw_batch_from(keys, buffer_ptrs, sizes, parallelisms, config,
                                   writer_partitions, False,
                                   "batch_put_tensor_with_parallelism_from")

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None):
        return self._pw_batch_from(keys, buffer_ptrs, sizes, parallelisms, config,
                                   writer_partitions, True,
                                   "batch_upsert_tensor_with_parallelism_from")
