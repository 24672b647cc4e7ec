"""Columnar codecs for mooncake.structured_object_store: one column of per-row Python values
(a DataProto `non_tensor_batch` field) becomes a few flat buffers plus JSON metadata, and back.

Every codec writes a `nulls` buffer (uint8 per row: 0 a value, 1 None, 2 MISSING) only when some
row is not a value. Ragged codecs keep their rows end to end in `data` with `offsets` (int64,
rows + 1 entries, in elements for typed data and bytes otherwise); rows of more than one
dimension keep `ndims` and `shapes`. Decoding checks every count and offset against the buffers
it was given (they come from the store, so from any client): a bad column raises ValueError and
never reads past a buffer.

  codec             rows                                decoded as
  ndarray           numbers (bool, int, float)          Python numbers
  typed_ragged      numeric lists / ndarrays            lists / ndarrays, one dtype
  bytes_ragged      bytes, bytearray, memoryview        bytes
  utf8_ragged       str                                 str
  msgpack_ragged    dicts / lists of plain values       dicts / lists (tuples come back as lists)
  ragged_tensor     torch tensors of one dtype          torch tensors (bfloat16 included)
  media_list_ragged lists of bytes                      lists of bytes
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from ._sos_infer import MISSING, _torch, torch_dtype

_VALUE, _NONE, _ABSENT = 0, 1, 2


def msgpack_module():
    try:
        import msgpack
    except ImportError as error:  # pragma: no cover - a declared dependency
        raise ImportError("mooncake.structured_object_store needs the msgpack package "
                          "(pip install msgpack)") from error
    return msgpack


@dataclass
class _EncodedStructuredLeaf:
    codec: str
    rows: int
    payload: Dict[str, Any]   # payload name -> ndarray / bytes
    metadata: Dict[str, Any]  # JSON-safe


# -- nulls and offsets ---------------------------------------------------------------------

def _null_marks(values):
    marks = np.zeros(len(values), dtype=np.uint8)
    for i, v in enumerate(values):
        if v is None:
            marks[i] = _NONE
        elif v is MISSING:
            marks[i] = _ABSENT
    return marks


def _with_nulls(payload, marks):
    if marks.any():
        payload["nulls"] = marks
    return payload


def _read_nulls(payload, rows):
    raw = payload.get("nulls")
    if raw is None:
        return None
    marks = np.frombuffer(raw, dtype=np.uint8)
    if len(marks) != rows:
        raise ValueError(f"structured column: nulls length {len(marks)} != rows {rows}")
    if (marks > _ABSENT).any():
        raise ValueError("structured column: a null mark is not 0, 1 or 2")
    return marks


def _restore_nulls(values, marks):
    if marks is None:
        return values
    for i, mark in enumerate(marks):
        if mark == _NONE:
            values[i] = None
        elif mark == _ABSENT:
            values[i] = MISSING
    return values


def _offsets(lengths):
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _read_offsets(payload, rows, total, name="offsets"):
    raw = payload.get(name)
    if raw is None:
        raise ValueError(f"structured column: missing {name}")
    offsets = np.frombuffer(raw, dtype=np.int64)
    if len(offsets) != rows + 1:
        raise ValueError(f"structured column: {name} length {len(offsets)} != rows + 1 ({rows + 1})")
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != total:
        raise ValueError(f"structured column: {name} are not a partition of {total} elements")
    return offsets


def _bytes_of(payload, name):
    raw = payload.get(name)
    if raw is None:
        return b""
    return raw


# -- codecs --------------------------------------------------------------------------------

def _encode_ndarray(values, decision):
    dtype = np.dtype(decision.metadata.get("dtype") or
                     np.result_type(*[v for v in values if v is not None and v is not MISSING]))
    marks = _null_marks(values)
    data = np.array([0 if m else v for v, m in zip(values, marks)], dtype=dtype)
    return {"data": data}, marks, {"dtype": dtype.str}


def _decode_ndarray(payload, rows, metadata):
    dtype = np.dtype(metadata["dtype"])
    if dtype.hasobject:
        raise ValueError("structured column: object dtype refused")
    data = np.frombuffer(_bytes_of(payload, "data"), dtype=dtype)
    if len(data) != rows:
        raise ValueError(f"structured column: {len(data)} values for {rows} rows")
    return data.tolist()


def _shapes_payload(shapes):
    ndims = np.array([len(s) for s in shapes], dtype=np.int64)
    flat = np.array([d for s in shapes for d in s], dtype=np.int64)
    return ndims, flat


def _read_shapes(payload, rows, lengths):
    """Per-row shapes from ndims / shapes, checked against each row's element count."""
    if "ndims" not in payload:
        return [(int(n),) for n in lengths]
    ndims = np.frombuffer(payload["ndims"], dtype=np.int64)
    flat = np.frombuffer(_bytes_of(payload, "shapes"), dtype=np.int64)
    if len(ndims) != rows or (ndims < 0).any() or int(ndims.sum()) != len(flat) or (flat < 0).any():
        raise ValueError("structured column: shapes do not match their row count")
    shapes, at = [], 0
    for n, length in zip(ndims, lengths):
        shape = tuple(int(d) for d in flat[at:at + n])
        at += n
        if int(np.prod(shape, dtype=np.int64)) != int(length):
            raise ValueError(f"structured column: shape {shape} does not hold {length} elements")
        shapes.append(shape)
    return shapes


def _encode_typed_ragged(values, decision):
    source = decision.metadata.get("recursive_source") or "list"
    marks = _null_marks(values)
    arrays = [np.asarray(v) if not m else None for v, m in zip(values, marks)]
    present = [a for a in arrays if a is not None]
    dtype = np.dtype(decision.metadata.get("dtype") or np.result_type(*present))
    arrays = [np.ascontiguousarray(a, dtype=dtype) if a is not None else np.empty(0, dtype)
              for a in arrays]
    data = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.empty(0, dtype)
    payload = {"data": data, "offsets": _offsets([a.size for a in arrays])}
    if any(a.ndim != 1 for a, m in zip(arrays, marks) if not m):
        payload["ndims"], payload["shapes"] = _shapes_payload(
            [a.shape if not m else (0,) for a, m in zip(arrays, marks)])
    return payload, marks, {"dtype": dtype.str, "source": source, "shape_policy": "ragged"}


def _decode_typed_ragged(payload, rows, metadata):
    dtype = np.dtype(metadata["dtype"])
    if dtype.hasobject:
        raise ValueError("structured column: object dtype refused")
    data = np.frombuffer(_bytes_of(payload, "data"), dtype=dtype)
    offsets = _read_offsets(payload, rows, len(data))
    shapes = _read_shapes(payload, rows, np.diff(offsets))
    as_arrays = metadata.get("source") == "ndarray"
    out = []
    for i in range(rows):
        row = data[offsets[i]:offsets[i + 1]].reshape(shapes[i])
        out.append(row.copy() if as_arrays else row.tolist())
    return out


def _encode_blobs(values, decision):
    text = decision.codec == "utf8_ragged"
    marks = _null_marks(values)
    blobs = []
    for i, (v, m) in enumerate(zip(values, marks)):
        if m:
            blobs.append(b"")
        elif text and isinstance(v, str):
            blobs.append(v.encode("utf-8"))
        elif not text and isinstance(v, (bytes, bytearray, memoryview)):
            blobs.append(bytes(v))
        else:
            raise TypeError(f"row {i} is a {type(v).__name__}, not "
                            f"{'str' if text else 'bytes-like'}")
    return {"data": b"".join(blobs), "offsets": _offsets([len(b) for b in blobs])}, marks, {}


def _decode_blobs(payload, rows, convert):
    data = bytes(_bytes_of(payload, "data"))
    offsets = _read_offsets(payload, rows, len(data))
    return [convert(data[offsets[i]:offsets[i + 1]]) for i in range(rows)]


def _encode_msgpack_ragged_values(path, values):
    """msgpack_ragged: each row packed on its own (payload, metadata)."""
    msgpack = msgpack_module()
    marks = _null_marks(values)
    blobs = []
    for v, m in zip(values, marks):
        if m:
            blobs.append(b"")
            continue
        try:
            blobs.append(msgpack.packb(v, use_bin_type=True))
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"{path}: a row does not serialize with msgpack: {error}") from error
    payload = _with_nulls({"data": b"".join(blobs), "offsets": _offsets([len(b) for b in blobs])},
                          marks)
    return payload, {}


def _decode_msgpack_ragged_values(payload, rows):
    msgpack = msgpack_module()
    marks = _read_nulls(payload, rows)
    data = bytes(_bytes_of(payload, "data"))
    offsets = _read_offsets(payload, rows, len(data))
    out = []
    for i in range(rows):
        if marks is not None and marks[i]:
            out.append(None)
            continue
        out.append(msgpack.unpackb(data[offsets[i]:offsets[i + 1]], raw=False,
                                   strict_map_key=False))
    return _restore_nulls(out, marks)


def _encode_ragged_tensor(values, decision):
    marks = _null_marks(values)
    rows = [v.detach().to("cpu").contiguous() if not m else None for v, m in zip(values, marks)]
    dtype = rows[next(i for i, r in enumerate(rows) if r is not None)].dtype
    blobs = [r.reshape(-1).view(_torch.uint8).numpy().tobytes() if r is not None and r.numel()
             else b"" for r in rows]
    shapes = [tuple(r.shape) if r is not None else (0,) for r in rows]
    ndims, flat = _shapes_payload(shapes)
    payload = {"data": b"".join(blobs),
               "offsets": _offsets([len(b) for b in blobs]), "ndims": ndims, "shapes": flat}
    return payload, marks, {"dtype": str(dtype)}


def _decode_ragged_tensor(payload, rows, metadata):
    dtype = torch_dtype(metadata["dtype"])
    item = _torch.empty(0, dtype=dtype).element_size()
    data = bytes(_bytes_of(payload, "data"))
    offsets = _read_offsets(payload, rows, len(data))
    lengths = np.diff(offsets)
    if (lengths % item).any():
        raise ValueError("structured column: a tensor row is not a whole number of elements")
    shapes = _read_shapes(payload, rows, lengths // item)
    out = []
    for i in range(rows):
        raw = bytearray(data[offsets[i]:offsets[i + 1]])
        flat = (_torch.frombuffer(raw, dtype=_torch.uint8) if raw
                else _torch.empty(0, dtype=_torch.uint8))
        out.append(flat.view(dtype).reshape(shapes[i]))
    return out


def _encode_media_list(values, decision):
    rows = [[bytes(item) for item in v] if v is not None and v is not MISSING else v
            for v in values]
    if any(r is not None and r is not MISSING and not all(isinstance(i, bytes) for i in r)
           for r in rows):
        raise ValueError("structured column: media lists of images are not supported; "
                         "store the encoded image bytes")
    payload, meta = _encode_msgpack_ragged_values("media_list", rows)
    return payload, None, meta


_ENCODERS = {
    "ndarray": _encode_ndarray,
    "typed_ragged": _encode_typed_ragged,
    "bytes_ragged": _encode_blobs,
    "utf8_ragged": _encode_blobs,
    "ragged_tensor": _encode_ragged_tensor,
    "media_list_ragged": _encode_media_list,
}


def encode_leaf(path: str, values: List[Any], decision) -> _EncodedStructuredLeaf:
    """Encode one column with the codec `decision` chose (ValueError when none applies)."""
    if not decision.accepted:
        raise ValueError(f"unsupported structured non-tensor field {path!r}: {decision.reason}")
    if decision.codec == "msgpack_ragged":
        payload, meta = _encode_msgpack_ragged_values(path, values)
        return _EncodedStructuredLeaf("msgpack_ragged", len(values), payload, meta)
    encoder = _ENCODERS.get(decision.codec)
    if encoder is None:
        raise ValueError(f"unsupported structured non-tensor field {path!r}: "
                         f"codec {decision.codec!r} is not supported")
    payload, marks, meta = encoder(values, decision)
    if marks is not None:
        _with_nulls(payload, marks)
    return _EncodedStructuredLeaf(decision.codec, len(values), payload, meta)


def decode_leaf(codec: str, payload: Dict[str, Any], rows: int, metadata: Dict[str, Any]):
    """The column's values, row by row (None and MISSING restored)."""
    if not isinstance(rows, int) or rows < 0:
        raise ValueError(f"structured column: bad row count {rows!r}")
    if codec == "msgpack_ragged":
        return _decode_msgpack_ragged_values(payload, rows)
    if codec == "media_list_ragged":
        return _decode_msgpack_ragged_values(payload, rows)
    marks = _read_nulls(payload, rows)
    if codec == "ndarray":
        values = _decode_ndarray(payload, rows, metadata)
    elif codec == "typed_ragged":
        values = _decode_typed_ragged(payload, rows, metadata)
    elif codec == "bytes_ragged":
        values = _decode_blobs(payload, rows, bytes)
    elif codec == "utf8_ragged":
        values = _decode_blobs(payload, rows, lambda b: b.decode("utf-8"))
    elif codec == "ragged_tensor":
        values = _decode_ragged_tensor(payload, rows, metadata)
    else:
        raise ValueError(f"structured column: unknown codec {codec!r}")
    return _restore_nulls(values, marks)
