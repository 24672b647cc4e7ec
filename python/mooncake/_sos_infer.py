"""Structure inference for mooncake.structured_object_store: which columnar codec a column of
Python values takes, and how nested dict / list rows expand into leaf columns.

A "column" is one value per batch row (a DataProto `non_tensor_batch` field). Rows may be None
(a null row) or, inside an expanded dict, MISSING (the row's dict has no such key). The rules
(the codec names, their order and the expansion limits) are upstream's, so a field takes the
same codec here as in upstream's wheel:

  all rows torch tensors of one dtype           -> ragged_tensor (mixed dtypes: not accepted)
  all rows lists of bytes / PIL images           -> media_list_ragged
  all rows numeric ndarrays                      -> typed_ragged   (object ndarrays: refused)
  all rows lists / tuples of numbers             -> typed_ragged
  all rows bool / int / float / numpy scalars    -> ndarray
  all rows bytes-like                            -> bytes_ragged
  all rows PIL images                            -> media_bytes
  all rows str                                   -> utf8_ragged
  all rows dict / list / tuple                   -> msgpack_ragged (the encoder checks that they pack)
  anything else, no rows, or only null rows      -> msgpack_ragged, not accepted
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np

try:
    import torch as _torch
except Exception:  # pragma: no cover - torch is optional
    _torch = None

INFER_MAX_STRUCT_KEYS = 64      # a dict column with more distinct keys stays one leaf
INFER_MAX_LIST_LEN = 8          # a list column with longer rows stays one leaf
INFER_MAX_DEPTH = 32            # deeper nesting is refused (ValueError), never recursed into


class _Missing:
    """A dict key absent from a row (not the same as a key whose value is None)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"

    def __reduce__(self):
        return "MISSING"


MISSING = _Missing()


def torch_dtype(name):
    """The torch dtype named "torch.float32" or "float32" (ValueError for anything else)."""
    if _torch is None:
        raise RuntimeError("this value is a torch tensor and torch is not installed")
    dtype = getattr(_torch, str(name).replace("torch.", ""), None)
    if not isinstance(dtype, _torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


@dataclass
class _CodecDecision:
    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict = field(default_factory=dict)


@dataclass
class _InferredLeaf:
    path: str
    values: List[Any]
    decision: _CodecDecision


@dataclass
class _InferredNode:
    path: str
    node_type: str                       # "dict" or "list"
    children: List[Any]                  # dict: sorted keys; list: positions 0..max_len-1
    lengths: Optional[List[int]] = None  # list: each row's length (0 for a non-list row)
    row_mask: Optional[List[bool]] = None  # rows that hold a real container


def _present(values):
    return [v for v in values if v is not None and v is not MISSING]


def _is_bytes_like(value) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_pil_image(value) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("PIL.") and hasattr(value, "save")


def _is_media_list(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        _is_pil_image(item) or _is_bytes_like(item) for item in value)


def _is_number(value) -> bool:
    return isinstance(value, (bool, int, float, np.number))


def _common_numeric_dtype(rows):
    """The dtype all list rows promote to, when it is numeric; else None."""
    try:
        dtype = np.result_type(*[np.asarray(row).dtype for row in rows])
    except (TypeError, ValueError, OverflowError):
        return None
    return dtype if np.issubdtype(dtype, np.number) else None


def _choose_leaf_codec(values) -> _CodecDecision:
    """The codec for one column of values (see the module docstring for the table)."""
    rows = _present(values)

    def decide(accepted, codec, reason, kind, **meta):
        return _CodecDecision(accepted, codec, reason, kind, dict(meta))

    if not rows:
        return decide(False, "msgpack_ragged", "all rows are null", "msgpack")
    if _torch is not None and all(isinstance(v, _torch.Tensor) for v in rows):
        dtypes = sorted({str(v.dtype) for v in rows})
        if len(dtypes) > 1:
            return decide(False, "ragged_tensor", f"mixed tensor dtype: {dtypes}",
                          "torch.Tensor")
        return decide(True, "ragged_tensor", "all non-null rows are Tensor", "torch.Tensor",
                      dtype=dtypes[0])
    if all(_is_media_list(v) for v in rows):
        return decide(True, "media_list_ragged", "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in rows):
        if all(np.issubdtype(v.dtype, np.number) for v in rows):
            return decide(True, "typed_ragged", "all rows are numeric ndarray",
                          "numeric sequence", recursive_source="ndarray")
        return decide(False, "msgpack_ragged", "object ndarray rows", "python object")
    if all(isinstance(v, (list, tuple)) for v in rows):
        dtype = _common_numeric_dtype(rows)
        if dtype is not None:
            return decide(True, "typed_ragged", "all rows are numeric sequences",
                          "numeric sequence", dtype=str(dtype))
    if all(_is_number(v) for v in rows):
        return decide(True, "ndarray", "all rows are numeric scalar", "numeric scalar",
                      dtype=str(np.result_type(*rows)))
    if all(_is_bytes_like(v) for v in rows):
        return decide(True, "bytes_ragged", "all rows are bytes-like", "bytes-like")
    if all(_is_pil_image(v) for v in rows):
        return decide(True, "media_bytes", "all rows are media", "media")
    if all(isinstance(v, str) for v in rows):
        return decide(True, "utf8_ragged", "all rows are str", "str")
    if all(isinstance(v, (dict, list, tuple)) for v in rows):
        if _packs(rows):
            return decide(True, "msgpack_ragged", "all rows are msgpack-like", "msgpack")
        return decide(False, "msgpack_ragged", "a row does not serialize", "python object")
    return decide(False, "msgpack_ragged", "no codec matched", "python object")


def _packs(rows) -> bool:
    """Whether every row serializes with msgpack (strict types: no silent conversions)."""
    from ._sos_codecs import msgpack_module
    msgpack = msgpack_module()
    try:
        for row in rows:
            msgpack.packb(row, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return False
    return True


def _escape_key(key: str) -> str:
    """A dict key as one path segment: '\\', '.' and '[' are escaped with a backslash."""
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _dict_keys(values):
    rows = _present(values)
    if not rows or not all(isinstance(v, dict) for v in rows):
        return None
    keys = set()
    for row in rows:
        keys.update(row.keys())
    if len(keys) > INFER_MAX_STRUCT_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_shape(values):
    rows = _present(values)
    if not rows or not all(isinstance(v, (list, tuple)) for v in rows):
        return None
    longest = max(len(v) for v in rows)
    if longest > INFER_MAX_LIST_LEN:
        return None
    if any(item is not None and not isinstance(item, (dict, list, tuple))
           for row in rows for item in row):
        return None  # lists of scalars are a leaf (typed_ragged, msgpack_ragged, ...)
    return longest, [len(v) if isinstance(v, (list, tuple)) else 0 for v in values]


def infer_structure(path: str, values, leaves: list, nodes: list, *, _depth: int = 0) -> None:
    """Expand a column into interior nodes (dicts, short lists of containers) and leaves,
    appending to `leaves` and `nodes`. A dict key missing from a row becomes MISSING in its
    child column; a row that is not a container becomes None there. Child paths are
    `path.key` (key escaped) and `path[i]`. Nesting deeper than INFER_MAX_DEPTH raises
    ValueError."""
    if _depth > INFER_MAX_DEPTH:
        raise ValueError(f"infer_structure: {path!r} is nested deeper than {INFER_MAX_DEPTH} levels")
    keys = _dict_keys(values)
    if keys is not None:
        is_row = [isinstance(v, dict) for v in values]
        nodes.append(_InferredNode(path, "dict", keys, row_mask=is_row))
        for key in keys:
            column = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{_escape_key(key)}", column, leaves, nodes,
                            _depth=_depth + 1)
        return
    shape = _list_shape(values)
    if shape is not None:
        longest, lengths = shape
        is_row = [isinstance(v, (list, tuple)) for v in values]
        nodes.append(_InferredNode(path, "list", list(range(longest)), lengths, row_mask=is_row))
        for index in range(longest):
            column = []
            for v in values:
                if not isinstance(v, (list, tuple)):
                    column.append(None)
                else:
                    column.append(v[index] if index < len(v) else MISSING)
            infer_structure(f"{path}[{index}]", column, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(_InferredLeaf(path, list(values), _choose_leaf_codec(values)))
