"""Structured objects for mooncake.structured_object_store: JSON metadata plus named members
(ndarrays, torch tensors, bytes) stored as a bundle, read back whole, by member, or by rows.

The bundle's `meta` payload is the caller's metadata as JSON with "layout" (default
"structured") and, under "__mooncake_structured_fields__", one spec per member:

  {"encoding": "ndarray", "dtype": "<i2", "shape": [3, 4]}     C-order bytes
  {"encoding": "bytes"}                                          the bytes as given
  {"encoding": "torch_tensor", "dtype": "torch.float32", "shape": [...], "format": F}
      F = "raw": the tensor's bytes in C order (any dtype, bfloat16 included);
          "store_tensor": written with the store's put_tensor, read with get_tensor;
          "tensor_object": a tensor-object buffer written with put_tensor_from.

Row reads (slice_member, axis 0) of ndarray and raw tensor members fetch only the rows' bytes
(get_into_ranges when the store has it); other members are read whole.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._sos_bundle import (MAX_MANIFEST_BYTES, BundleManifestStore, BundleTransferPolicy,
                          RemoteBundleRef, _MultiBufferPayload, decode_json, encode_json)
from ._sos_infer import _torch, torch_dtype
from ._sos_transport import _has, call_with_config, check_status

STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """A structured object to store: JSON-safe metadata plus named members."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(self, metadata: Optional[Mapping[str, Any]] = None,
                 buffers: Optional[Mapping[str, Any]] = None) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    metadata: Dict[str, Any]
    objects: Dict[str, Any]


@dataclass(frozen=True)
class StructuredMemberSlice:
    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """What to read of a stored structured object: all members or some, and row slices."""

    ref: Any
    member_names: Optional[Tuple[str, ...]] = None
    member_slices: Tuple[Tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Optional[Sequence[str]]) -> "StructuredObjectReadSpec":
        return StructuredObjectReadSpec(self.ref, None if names is None else tuple(names),
                                        self.member_slices)

    def slice_member(self, name: str, axis: int, start: int, end: int,
                     step: int = 1) -> "StructuredObjectReadSpec":
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis, start, end, step)
        return StructuredObjectReadSpec(self.ref, self.member_names, tuple(slices.items()))

    def member_slice(self, name: str) -> Optional[StructuredMemberSlice]:
        return dict(self.member_slices).get(name)


@dataclass(frozen=True)
class _TensorPayload:
    tensor: Any


@dataclass(frozen=True)
class _TensorObjectBufferPayload:
    """Memory that holds a tensor object in the store's tensor format (header + data), e.g.
    a BufferPool lease: written with put_tensor_from, read back into such memory."""

    ptr: int
    size: int
    owner: Any
    batch_size: Optional[int] = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class _RawDestinationBuffer:
    ptr: int
    size: int
    owner: Any
    pre_registered: bool = False


def tensor_object_buffer(ptr: int, size: int, owner: Any = None,
                         batch_size: Optional[int] = None) -> _TensorObjectBufferPayload:
    return _TensorObjectBufferPayload(int(ptr), int(size), owner, batch_size)


def raw_destination(ptr: int, size: int, owner: Any = None, *,
                    pre_registered: bool = False) -> _RawDestinationBuffer:
    return _RawDestinationBuffer(int(ptr), int(size), owner, pre_registered)


class _PoolLeaseOwner:
    """Gives a BufferPool lease back once: at release_result, or when garbage-collected."""

    def __init__(self, lease):
        self.lease, self.released = lease, False

    def release(self):
        if not self.released:
            self.released = True
            self.lease.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _PoolBackedNdarray(np.ndarray):
    """An ndarray over a BufferPool lease; views share the owner (keep the base alive)."""

    def __array_finalize__(self, obj):
        self._mooncake_pool_owner = getattr(obj, "_mooncake_pool_owner", None)


def _pool_array(pool, dtype, shape):
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    lease = pool.acquire(nbytes)
    owner = _PoolLeaseOwner(lease)
    raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(lease.ptr)
    array = np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
    array = array.view(_PoolBackedNdarray)
    array._mooncake_pool_owner = owner
    return array


def _is_tensor(value) -> bool:
    return _torch is not None and isinstance(value, _torch.Tensor)


def _shape_list(value) -> list:
    if not isinstance(value, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise ValueError(f"structured member shape must be a list of sizes, got {value!r}")
    return value


def _row_ranges(shape, itemsize, member_slice):
    """(output shape, [(src offset, dst offset, length)]) for a slice on axis 0."""
    if member_slice is None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        return tuple(shape), ([(0, 0, nbytes)] if nbytes else [])
    if member_slice.axis != 0:
        raise ValueError("structured member slices support only axis=0")
    if member_slice.step <= 0:
        raise ValueError("structured member slice step must be positive")
    if not shape:
        raise ValueError("a 0-dimensional member cannot be sliced")
    rows = range(*slice(member_slice.start, member_slice.end, member_slice.step)
                 .indices(shape[0]))
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    out_shape = (len(rows),) + tuple(shape[1:])
    if not row_bytes or not len(rows):
        return out_shape, []
    if member_slice.step == 1:
        return out_shape, [(rows.start * row_bytes, 0, len(rows) * row_bytes)]
    return out_shape, [(r * row_bytes, i * row_bytes, row_bytes) for i, r in enumerate(rows)]


def _rows_ranges(shape, itemsize, indices):
    """(output shape, ranges) for a gather of rows by index on axis 0."""
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    out_shape = (len(indices),) + tuple(shape[1:])
    if not row_bytes:
        return out_shape, []
    return out_shape, [(r * row_bytes, i * row_bytes, row_bytes) for i, r in enumerate(indices)]


class StructuredObjectLayer:
    def __init__(self, bundles: BundleManifestStore, buffer_pool=None):
        self.bundles = bundles
        self.transport = bundles.transport
        self.buffer_pool = buffer_pool

    # -- put -------------------------------------------------------------------------------
    def put(self, payload: StructuredObjectPayload, partition="default", chunk_bytes=None,
            policy: Optional[BundleTransferPolicy] = None, max_inflight_put=None,
            config=None) -> RemoteBundleRef:
        if not isinstance(payload, StructuredObjectPayload):
            raise TypeError("put_structured_object expects a StructuredObjectPayload")
        metadata = _normalize_metadata(payload.metadata)
        specs, members = {}, {}
        for name, value in payload.buffers.items():
            specs[name], members[name] = _encode_member(name, value)
        if specs:
            metadata[STRUCTURED_FIELD_SPECS_KEY] = specs
        meta = encode_json(metadata, "structured metadata")

        def put_special(key, value, policy):
            return self._put_tensor_member(key, value, policy, config)

        return self.bundles.put_bundle(meta, members, partition, chunk_bytes, policy,
                                       max_inflight_put, config, put_special)

    def _put_tensor_member(self, key, value, policy, config):
        store = self.transport.store
        if isinstance(value, _TensorObjectBufferPayload):
            if not _has(store, "put_tensor_from"):
                raise RuntimeError("this store has no put_tensor_from for a tensor object buffer")
            mine = self.transport.can_register() and self.transport.register(value.ptr,
                                                                              value.size)
            try:
                check_status(store.put_tensor_from(key, value.ptr, value.size),
                             "put_tensor_from", key)
            finally:
                if mine:
                    self.transport.unregister(value.ptr)
            return ({"key": key, "bytes": value.size,
                     "chunks": [{"key": key, "bytes": value.size}], "kind": "tensor"}, [key])
        if not isinstance(value, _TensorPayload):
            return None
        tensor = value.tensor
        if policy.copy_mode == "zero_copy":
            raise ValueError("zero-copy structured tensor fields require a BufferPool "
                             "tensor-object buffer (tensor_object_buffer)")
        writer = None
        if policy.copy_mode == "auto" and tensor.dim() > 0:
            if config is not None and _has(store, "pub_tensor"):
                writer = lambda: call_with_config(store.pub_tensor, key,  # noqa: E731
                                                  tensor, config=config)
            elif _has(store, "put_tensor"):
                writer = lambda: store.put_tensor(key, tensor)  # noqa: E731
        if writer is not None:
            check_status(writer(), "put_tensor", key)
            data = tensor.numel() * tensor.element_size()
            spec = {"key": key, "bytes": data, "chunks": [{"key": key, "bytes": data}],
                    "kind": "tensor", "format": "store_tensor"}
            size = store.get_size(key) if _has(store, "get_size") else None
            if isinstance(size, int) and size > data:
                # The stored object: the tensor header, then the data (the store's tensor
                # layout): readers fetch the data (or rows of it) straight into their memory.
                spec.update(bytes=size, chunks=[{"key": key, "bytes": size}],
                            header_bytes=size - data)
            return spec, [key]
        return value.raw_bytes()  # the bundle layer writes these bytes in chunks

    # -- read ------------------------------------------------------------------------------
    def read_spec(self, ref) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(ref=ref)

    def read_metadata(self, manifest) -> Dict[str, Any]:
        if manifest["meta"]["bytes"] > MAX_MANIFEST_BYTES:  # checked before it is allocated
            raise ValueError(f"structured metadata of {manifest['meta']['bytes']} bytes is over "
                             f"the {MAX_MANIFEST_BYTES}-byte limit")
        meta = self.transport.read_payload(manifest["meta"])
        metadata = decode_json(meta, "structured metadata")
        specs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
        if not isinstance(specs, dict):
            raise ValueError("structured metadata field specs must be a mapping")
        return metadata

    def materialize(self, spec: StructuredObjectReadSpec,
                    destinations: Optional[Mapping[str, Any]] = None) -> StructuredObjectResult:
        if not isinstance(spec, StructuredObjectReadSpec):
            raise TypeError("materialize expects a StructuredObjectReadSpec (read_spec(ref))")
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured object read spec selected no members")
        manifest = self.bundles.resolve_manifest(spec.ref)
        metadata = self.read_metadata(manifest)
        specs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
        names = list(manifest["buffers"]) if spec.member_names is None else list(spec.member_names)
        destinations = dict(destinations or {})
        objects = {}
        for name in names:
            if name not in manifest["buffers"]:
                raise KeyError(f"structured object has no member {name!r}")
            objects[name] = self.read_member(manifest["buffers"][name], specs.get(name, {}),
                                             spec.member_slice(name), None,
                                             destinations.get(name))
        return StructuredObjectResult(metadata=metadata, objects=objects)

    def read_member(self, payload, field_spec, member_slice=None, indices=None,
                    destination=None):
        """One member; member_slice (axis 0) or indices (a row gather) select rows."""
        encoding = field_spec.get("encoding", "bytes")
        if encoding != "bytes":  # bytes members are read with read_payload, which checks
            self.transport.check_stored(payload)
        if encoding == "ndarray":
            dtype = np.dtype(field_spec.get("dtype"))
            if dtype.hasobject:
                raise ValueError("structured member dtype must not be object")
            shape = _shape_list(field_spec.get("shape"))
            if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != payload["bytes"]:
                raise ValueError("structured member size does not match its dtype and shape")
            return self._read_array(payload, dtype, shape, member_slice, indices, destination)
        if encoding == "torch_tensor":
            return self._read_tensor(payload, field_spec, member_slice, indices, destination)
        if encoding not in ("bytes",):
            raise ValueError(f"unsupported structured field encoding {encoding!r}")
        if member_slice is not None or indices is not None:
            raise ValueError(f"structured member encoding {encoding!r} does not support slicing")
        if encoding != "bytes":
            raise ValueError(f"unsupported structured field encoding {encoding!r}")
        if destination is not None:
            return self._read_into_raw(payload, destination)
        return bytes(self.transport.read_payload(payload))

    def _plan(self, shape, itemsize, member_slice, indices):
        if indices is not None:
            return _rows_ranges(shape, itemsize, indices)
        return _row_ranges(shape, itemsize, member_slice)

    def _read_array(self, payload, dtype, shape, member_slice, indices, destination):
        out_shape, ranges = self._plan(shape, dtype.itemsize, member_slice, indices)
        if isinstance(destination, _RawDestinationBuffer):
            out = _raw_array(destination, dtype, out_shape)
            registered = destination.pre_registered
        elif destination is not None:
            out = _check_destination(destination, dtype, out_shape)
            registered = False
        elif self.buffer_pool is not None and out_shape and int(np.prod(out_shape)):
            out = _pool_array(self.buffer_pool, dtype, out_shape)
            registered = True  # leases are registered memory
        else:
            out = np.empty(out_shape, dtype=dtype)
            registered = False
        if ranges:
            self._fill(payload, int(out.ctypes.data), ranges, registered)
        return out

    def _fill(self, payload, ptr, ranges, registered):
        whole = len(ranges) == 1 and ranges[0][0] == 0 and ranges[0][2] == payload["bytes"]
        if whole and not registered:
            self.transport.read_chunks_into(payload["chunks"], ptr)
        else:
            self.transport.read_ranges_into(payload, ptr, ranges, dest_registered=registered)

    def _read_into_raw(self, payload, destination):
        if not isinstance(destination, _RawDestinationBuffer):
            raise TypeError("a bytes member's destination must be a raw_destination")
        if destination.size < payload["bytes"]:
            raise ValueError(f"destination holds {destination.size} bytes; the member has "
                             f"{payload['bytes']}")
        if payload["bytes"]:
            self.transport.read_ranges_into(payload, destination.ptr,
                                            [(0, 0, payload["bytes"])],
                                            dest_registered=destination.pre_registered)
        return destination

    def _read_tensor(self, payload, field_spec, member_slice, indices, destination):
        fmt = payload.get("format") or field_spec.get("format", "raw")
        store = self.transport.store
        if fmt == "nested_rows":
            return self._read_nested(payload, field_spec, member_slice, indices, destination)
        if fmt in ("store_tensor", "tensor_object"):
            if isinstance(destination, _TensorObjectBufferPayload):
                if member_slice is not None or indices is not None:
                    raise ValueError("a tensor object buffer destination takes the whole tensor")
                return self._get_tensor_object_into(payload["key"], destination,
                                                    as_tensor=fmt == "store_tensor")
            header = payload.get("header_bytes")
            if fmt == "store_tensor" and isinstance(header, int) and header > 0 and \
                    isinstance(field_spec.get("shape"), list):
                return self._read_raw_tensor(payload, field_spec, member_slice, indices,
                                             destination, header)
            if not _has(store, "get_tensor"):
                raise RuntimeError("this store does not support get_tensor, which this "
                                   "tensor member needs")
            tensor = store.get_tensor(payload["key"])
            if tensor is None:
                raise RuntimeError(f"mooncake get_tensor of {payload['key']!r} found nothing")
            return _select_rows(tensor, member_slice, indices, destination)
        if fmt != "raw":
            raise ValueError(f"unknown structured tensor format {fmt!r}")
        return self._read_raw_tensor(payload, field_spec, member_slice, indices, destination, 0)

    def _read_nested(self, payload, field_spec, member_slice, indices, destination):
        if destination is not None:
            raise ValueError("a nested tensor member does not support destinations")
        dtype = torch_dtype(field_spec.get("dtype"))
        shapes = field_spec.get("row_shapes")
        if not isinstance(shapes, list):
            raise ValueError("nested tensor member without row shapes")
        shapes = [tuple(_shape_list(s)) for s in shapes]
        itemsize = _torch.empty(0, dtype=dtype).element_size()
        sizes = [int(np.prod(s, dtype=np.int64)) * itemsize for s in shapes]
        if sum(sizes) != payload["bytes"]:
            raise ValueError("nested tensor rows do not add up to the member's size")
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        if indices is not None:
            picked = list(indices)
        elif member_slice is not None:
            if member_slice.step <= 0:
                raise ValueError("structured member slice step must be positive")
            picked = list(range(*slice(member_slice.start, member_slice.end,
                                       member_slice.step).indices(len(shapes))))
        else:
            picked = list(range(len(shapes)))
        total = sum(sizes[i] for i in picked)
        buf = np.empty(max(total, 1), dtype=np.uint8)
        ranges, at = [], 0
        for i in picked:
            if sizes[i]:
                ranges.append((starts[i], at, sizes[i]))
            at += sizes[i]
        if ranges:
            self._fill(payload, int(buf.ctypes.data), ranges, False)
        rows, at = [], 0
        for i in picked:
            raw = _torch.from_numpy(buf[at:at + sizes[i]].copy()) if sizes[i] else \
                _torch.empty(0, dtype=_torch.uint8)
            rows.append(raw.view(dtype).reshape(shapes[i]))
            at += sizes[i]
        layout = _torch.jagged if field_spec.get("layout") == "jagged" else _torch.strided
        if not rows:  # no row selected: an empty nested tensor of the same kind
            if layout == _torch.jagged:
                return _torch.nested.nested_tensor_from_jagged(
                    _torch.empty(0, dtype=dtype), offsets=_torch.zeros(1, dtype=_torch.int64))
            return _torch.nested.nested_tensor([], dtype=dtype)
        return _torch.nested.as_nested_tensor(rows, layout=layout)

    def _read_raw_tensor(self, payload, field_spec, member_slice, indices, destination, base):
        """A tensor whose C-order bytes lie at `base` in the payload (after a header)."""
        dtype = torch_dtype(field_spec.get("dtype"))
        shape = _shape_list(field_spec.get("shape"))
        itemsize = _torch.empty(0, dtype=dtype).element_size()
        if base + int(np.prod(shape, dtype=np.int64)) * itemsize != payload["bytes"]:
            raise ValueError("structured tensor size does not match its dtype and shape")
        out_shape, ranges = self._plan(shape, itemsize, member_slice, indices)
        ranges = [(src + base, dst, n) for src, dst, n in ranges]
        out = destination if destination is not None else _torch.empty(out_shape, dtype=dtype)
        if tuple(out.shape) != tuple(out_shape) or out.dtype != dtype or \
                not out.is_contiguous() or out.device.type != "cpu":
            raise ValueError(f"tensor destination shape mismatch: need a contiguous CPU "
                             f"{dtype} tensor of shape {tuple(out_shape)}")
        if ranges:
            self._fill(payload, int(out.data_ptr()), ranges, False)
        return out

    def _get_tensor_object_into(self, key, destination, as_tensor):
        """The object into the destination's memory: the destination itself (a tensor
        object buffer member), or the tensor over it (a member written with put_tensor)."""
        store = self.transport.store
        if not _has(store, "get_into"):
            raise RuntimeError("this store has no get_into for a tensor object buffer")
        mine = self.transport.can_register() and self.transport.register(destination.ptr,
                                                                          destination.size)
        try:
            rc = store.get_into(key, destination.ptr, destination.size)
        finally:
            if mine:
                self.transport.unregister(destination.ptr)
        if rc < 0:
            raise RuntimeError(f"mooncake get_into of {key!r} failed: code {rc}")
        if not as_tensor:
            return destination
        from . import _tensor_layout
        metadata = _tensor_layout.parse_at(destination.ptr, rc)
        if metadata is None:
            raise ValueError(f"{key!r} does not hold a tensor object (its header is not one)")
        return _tensor_layout.tensor_over(_torch, metadata, destination.ptr, destination.owner)


def _select_rows(tensor, member_slice, indices, destination):
    if indices is not None:
        tensor = tensor[list(indices)]
    elif member_slice is not None:
        if member_slice.axis != 0:
            raise ValueError("structured member slices support only axis=0")
        if member_slice.step <= 0:
            raise ValueError("structured member slice step must be positive")
        tensor = tensor[member_slice.start:member_slice.end:member_slice.step]
    if destination is not None:
        if tuple(destination.shape) != tuple(tensor.shape):
            raise ValueError("tensor destination shape mismatch")
        destination.copy_(tensor)
        return destination
    return tensor


def _raw_array(destination, dtype, shape):
    """An ndarray over a raw_destination's memory (its owner kept alive by the array)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if destination.size < nbytes:
        raise ValueError(f"destination shape mismatch: the raw destination holds "
                         f"{destination.size} bytes, the rows need {nbytes}")
    raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(destination.ptr)
    array = np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
    array = array.view(_PoolBackedNdarray)
    array._mooncake_pool_owner = None
    array._mooncake_destination_owner = destination.owner
    return array


def _check_destination(destination, dtype, shape):
    if not isinstance(destination, np.ndarray):
        raise TypeError("an ndarray member's destination must be a numpy array")
    if destination.dtype != dtype or tuple(destination.shape) != tuple(shape):
        raise ValueError(f"destination shape mismatch: need {dtype} {tuple(shape)}, got "
                         f"{destination.dtype} {destination.shape}")
    if not destination.flags["C_CONTIGUOUS"]:
        raise ValueError("destination must be C-contiguous")
    if not destination.flags["WRITEABLE"]:
        raise ValueError("destination must be writeable")
    return destination


def _normalize_metadata(metadata) -> Dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError("structured metadata must be a mapping")
    out = dict(metadata)
    if STRUCTURED_FIELD_SPECS_KEY in out:
        raise ValueError(f"structured metadata key {STRUCTURED_FIELD_SPECS_KEY!r} is reserved")
    if not isinstance(out.get("layout", "structured"), str):
        raise ValueError("structured metadata layout must be a string")
    out.setdefault("layout", "structured")
    return out


def _encode_member(name, value):
    """(field spec, what the bundle layer writes) for one member."""
    if isinstance(value, _TensorObjectBufferPayload):
        return {"encoding": "torch_tensor", "format": "tensor_object"}, value
    if isinstance(value, _TensorPayload):
        value = value.tensor
    if _is_tensor(value) and value.is_nested:
        return _encode_nested(name, value)
    if _is_tensor(value):
        if value.layout != _torch.strided:
            raise TypeError(f"structured member {name!r}: only strided and nested tensors are "
                            "supported (sparse ones are not)")
        cpu = value.detach().to("cpu").contiguous()
        spec = {"encoding": "torch_tensor", "dtype": str(cpu.dtype), "shape": list(cpu.shape),
                "format": "raw"}
        return spec, _TensorRaw(cpu)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"structured member {name!r}: object arrays are not supported "
                            "(use put_dataproto for per-row Python values)")
        array = np.ascontiguousarray(value)
        return {"encoding": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape)}, array
    if isinstance(value, _MultiBufferPayload):
        if value.dtype is not None and value.shape is not None:
            return {"encoding": "ndarray", "dtype": np.dtype(value.dtype).str,
                    "shape": list(value.shape)}, value
        return {"encoding": "bytes"}, value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"encoding": "bytes"}, value
    raise TypeError(f"structured member {name!r}: unsupported value type "
                    f"{type(value).__name__} (ndarray, torch tensor or bytes-like)")


def _encode_nested(name, value):
    """A nested (jagged) tensor: its rows end to end, each row's shape in the spec."""
    rows = [r.detach().to("cpu").contiguous() for r in value.unbind()]
    spec = {"encoding": "torch_tensor", "dtype": str(value.dtype), "nested": True,
            "format": "nested_rows", "layout": "jagged" if value.layout == _torch.jagged
            else "strided", "row_shapes": [list(r.shape) for r in rows]}
    parts = [r.reshape(-1).view(_torch.uint8).numpy() for r in rows if r.numel()]
    data = np.concatenate(parts) if parts else np.empty(0, np.uint8)
    return spec, data


class _TensorRaw(_TensorPayload):
    """A CPU tensor: put_tensor when the store has it, else its bytes (raw)."""

    def raw_bytes(self):
        t = self.tensor
        if t.numel() == 0:
            return np.empty(0, np.uint8)
        return t.reshape(-1).view(_torch.uint8).numpy()
