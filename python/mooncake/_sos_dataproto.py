"""DataProto-like objects (verl's batch / non_tensor_batch / meta_info) as stage-level
structured objects, for mooncake.structured_object_store.

A put writes one structured object per stage: batch field F is member "batch.F" (a tensor or
ndarray); a numeric non_tensor_batch array is member "non_tensor_batch.F"; an object array is
encoded column-wise (see _sos_codecs) into members "non_tensor_batch.F.<part>". The returned
MooncakeDataProtoRef routes each field name to (stage, member, section) and keeps meta_info;
export_dataproto_ref turns it into a JSON-safe handle (upstream's "mooncake_dataproto_ref" v1)
that another process imports. Rows of non_tensor_batch object arrays that are dicts or short
lists of containers are split into leaf columns ("structured_recursive"), so a dict of tensors
per row keeps tensors as tensors.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ._sos_bundle import RemoteBundleRef, check_key_segment
from ._sos_codecs import _EncodedStructuredLeaf, decode_leaf, encode_leaf
from ._sos_infer import MISSING, _choose_leaf_codec, _escape_key, _torch, infer_structure
from ._sos_structured import (STRUCTURED_FIELD_SPECS_KEY, StructuredMemberSlice,
                              StructuredObjectPayload, _TensorObjectBufferPayload)

DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"
SECTIONS = ("batch", "non_tensor_batch", "meta_info")


@dataclass(frozen=True)
class FieldSchema:
    """A codec hint for a field ("auto" or a codec name); metadata["section"] may pin it."""

    codec: str
    nullable: bool = True
    metadata: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StructuredFieldLocation:
    stage: str
    member: str
    section: str  # "batch" | "non_tensor_batch"


@dataclass
class MooncakeDataProtoRef:
    batch_size: int
    stage_refs: Dict[str, RemoteBundleRef]
    field_index: Dict[str, StructuredFieldLocation]
    meta_info: Dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: Optional[List[int]] = None
    encoded_non_tensor: Dict[str, Any] = field(default_factory=dict)
    _storage_group_id: Optional[str] = field(default=None, repr=False)


# -- handles ---------------------------------------------------------------------------------

def is_dataproto_ref_handle(value) -> bool:
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def _json_safe(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [_json_safe(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    raise TypeError(f"DataProto ref value of type {type(value).__name__} is not JSON-safe")


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> Dict[str, Any]:
    """A JSON-safe handle for another process (manifest keys, not manifests)."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle = {
        "type": DATAPROTO_REF_HANDLE_TYPE, "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": "bundle_stages", "batch_size": int(ref.batch_size),
        "namespace": ref.namespace, "partition": ref.partition,
        "global_indexes": _json_safe(ref.global_indexes),
        "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
        "field_index": {n: {"stage": l.stage, "member": l.member, "section": l.section}
                        for n, l in ref.field_index.items()},
        "meta_info": _json_safe(ref.meta_info),
        "encoded_non_tensor": _json_safe(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(handle)
    return handle


def _mapping(value, name):
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")
    return value


def _name(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError(f"DataProto ref handle {what} must be a non-empty string")
    return value


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    if handle.get("version") not in (DATAPROTO_REF_HANDLE_VERSION, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {handle.get('version')!r}")
    if handle.get("kind") != "bundle_stages":
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")
    stage_refs = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        stage_refs[_name(stage, "stage name")] = RemoteBundleRef(
            _name(key, "manifest_key"), {})
    field_index = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section = loc.get("section")
        if section not in ("batch", "non_tensor_batch"):
            raise ValueError(f"invalid DataProto field section: {section!r}")
        stage = _name(loc.get("stage"), "field stage")
        if stage not in stage_refs:
            raise ValueError(f"DataProto ref handle field {name!r} references unknown stage "
                             f"{stage!r}")
        field_index[_name(name, "field name")] = StructuredFieldLocation(
            stage, _name(loc.get("member"), "field member"), section)
    indexes = handle.get("global_indexes")
    if indexes is not None and (not isinstance(indexes, list) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in indexes)):
        raise ValueError("DataProto ref handle global_indexes must be a list of integers")
    group = handle.get(STORAGE_GROUP_ID)
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError("DataProto ref handle has invalid storage_group_id")
    batch_size = handle.get("batch_size")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError("DataProto ref handle batch_size must be a non-negative integer")
    return MooncakeDataProtoRef(
        batch_size=batch_size, stage_refs=stage_refs, field_index=field_index,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")), global_indexes=indexes,
        encoded_non_tensor=dict(_mapping(handle.get("encoded_non_tensor", {}),
                                         "encoded_non_tensor")),
        _storage_group_id=group)


def resolve_ref(ref) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected MooncakeDataProtoRef or DataProto handle, got {type(ref).__name__}")


# -- splitting the input ---------------------------------------------------------------------

def _as_dict(value, what) -> Dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "keys") and hasattr(value, "__getitem__"):  # TensorDict and the like
        return {k: value[k] for k in value.keys()}
    raise TypeError(f"DataProto {what} must be a mapping, got {type(value).__name__}")


def split_dataproto_like(data):
    if isinstance(data, Mapping):
        if data and set(data) <= set(SECTIONS) and all(
                v is None or isinstance(v, Mapping) or hasattr(v, "keys")
                for v in data.values()):
            return (_as_dict(data.get("batch"), "batch"),
                    _as_dict(data.get("non_tensor_batch"), "non_tensor_batch"),
                    _as_dict(data.get("meta_info"), "meta_info"))
        return dict(data), {}, {}
    if not any(hasattr(data, s) for s in SECTIONS):
        raise TypeError(f"expected a DataProto-like object or a dict, got {type(data).__name__}")
    return (_as_dict(getattr(data, "batch", None), "batch"),
            _as_dict(getattr(data, "non_tensor_batch", None), "non_tensor_batch"),
            _as_dict(getattr(data, "meta_info", None), "meta_info"))


def _rows_of(name, value) -> int:
    if isinstance(value, _TensorObjectBufferPayload):
        return len(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            raise ValueError(f"DataProto field {name!r} is 0-dimensional; fields are per row")
        return int(shape[0])
    return len(value)


def batch_size_of(batch, non_tensor) -> int:
    sizes = {}
    for section in (batch, non_tensor):
        for name, value in section.items():
            sizes[name] = _rows_of(name, value)
    if len(set(sizes.values())) > 1:
        raise ValueError(f"DataProto fields have inconsistent batch sizes: {sizes}")
    return next(iter(sizes.values()), 0)


def _object_column(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    column = np.empty(len(value), dtype=object)
    for i, v in enumerate(value):
        column[i] = v
    return column


# -- non-tensor columns ------------------------------------------------------------------------

def encode_non_tensor(path: str, column: np.ndarray) -> _EncodedStructuredLeaf:
    """An object column as flat payloads: one codec, or leaf columns of dict / list rows."""
    leaves, nodes = [], []
    values = list(column)
    infer_structure(path, values, leaves, nodes)
    if not nodes or not any(_needs_leaf_columns(leaf) for leaf in leaves):
        decision = _choose_leaf_codec(values)
        if not decision.accepted:
            raise ValueError(f"unsupported structured non-tensor field {path!r}: "
                             f"{decision.reason}")
        return encode_leaf(path, values, decision)
    payload, leaf_meta = {}, []
    for i, leaf in enumerate(leaves):
        if not [v for v in leaf.values if v is not None and v is not MISSING]:
            encoded = None  # a column of nulls only: its marks are all it needs
        else:
            encoded = encode_leaf(leaf.path, leaf.values, leaf.decision)
        names = []
        if encoded is not None:
            for part, data in encoded.payload.items():
                payload[f"l{i}.{part}"] = data
                names.append(part)
        marks = [0 if v is not None and v is not MISSING else (1 if v is None else 2)
                 for v in leaf.values]
        leaf_meta.append({"path": leaf.path, "codec": None if encoded is None else encoded.codec,
                          "metadata": {} if encoded is None else encoded.metadata,
                          "payload": names, "marks": None if encoded is not None else marks})
    meta = {"root": path, "leaves": leaf_meta,
            "nodes": [{"path": n.path, "node_type": n.node_type, "children": n.children,
                       "lengths": n.lengths, "row_mask": n.row_mask} for n in nodes]}
    return _EncodedStructuredLeaf("structured_recursive", len(values), payload, meta)


FORCEABLE_CODECS = ("ndarray", "typed_ragged", "bytes_ragged", "utf8_ragged", "msgpack_ragged",
                    "ragged_tensor")


def encode_with_schema(path: str, column: np.ndarray, schema: FieldSchema):
    """The column in the codec a FieldSchema names (no inference); a failure says the field
    and the codec. metadata["dtype"] sets typed_ragged's and ndarray's dtype."""
    from ._sos_infer import _CodecDecision
    if schema.codec not in FORCEABLE_CODECS:
        raise ValueError(f"FieldSchema for {path!r}: codec {schema.codec!r} is not supported "
                         f"(use 'auto' or one of {', '.join(FORCEABLE_CODECS)})")
    values = list(column)
    meta = {}
    dtype = (schema.metadata or {}).get("dtype")
    if dtype is not None:
        meta["dtype"] = str(np.dtype(dtype))
    present = [v for v in values if v is not None and v is not MISSING]
    if schema.codec == "typed_ragged" and present and all(isinstance(v, np.ndarray)
                                                          for v in present):
        meta["recursive_source"] = "ndarray"
    decision = _CodecDecision(True, schema.codec, "FieldSchema", "schema", meta)
    try:
        return encode_leaf(path, values, decision)
    except (TypeError, ValueError, AttributeError, RuntimeError, OverflowError) as exc:
        raise type(exc)(f"failed to encode non_tensor_batch field {path!r} with FieldSchema "
                        f"codec {schema.codec!r}: {exc}") from exc


def _needs_leaf_columns(leaf) -> bool:
    """Whether dict / list rows must be split into columns: msgpack would not keep this
    leaf's values as they are (tensors, bytes, ndarrays); plain JSON-like rows stay whole."""
    codec = leaf.decision.codec
    if codec in ("ragged_tensor", "bytes_ragged", "media_bytes", "media_list_ragged"):
        return True
    return codec == "typed_ragged" and any(isinstance(v, np.ndarray) for v in leaf.values)


def decode_non_tensor(encoded: Mapping[str, Any], payload: Mapping[str, Any]) -> List[Any]:
    codec, rows, meta = encoded.get("codec"), encoded.get("rows"), encoded.get("metadata", {})
    if codec != "structured_recursive":
        return decode_leaf(codec, dict(payload), rows, meta)
    columns = {}
    for i, leaf in enumerate(meta.get("leaves", [])):
        if leaf.get("codec") is None:
            marks = leaf.get("marks") or []
            if len(marks) != rows:
                raise ValueError("structured column: null marks do not match the rows")
            columns[leaf["path"]] = [None if m == 1 else MISSING for m in marks]
            continue
        parts = {p: payload[f"l{i}.{p}"] for p in leaf.get("payload", [])}
        columns[leaf["path"]] = decode_leaf(leaf["codec"], parts, rows, leaf.get("metadata", {}))
    nodes = {n["path"]: n for n in meta.get("nodes", [])}

    def build(path, depth=0):
        if depth > 64:
            raise ValueError("structured column: nesting too deep")
        if path in columns:
            return columns[path]
        node = nodes.get(path)
        if node is None:
            raise ValueError(f"structured column: nothing stored for {path!r}")
        mask = node.get("row_mask") or [True] * rows
        if len(mask) != rows:
            raise ValueError("structured column: row mask does not match the rows")
        out = []
        if node["node_type"] == "dict":
            kids = {k: build(f"{path}.{_escape_key(k)}", depth + 1) for k in node["children"]}
            for r in range(rows):
                out.append({k: c[r] for k, c in kids.items() if c[r] is not MISSING}
                           if mask[r] else None)
        else:
            kids = [build(f"{path}[{j}]", depth + 1) for j in node["children"]]
            lengths = node.get("lengths") or [0] * rows
            for r in range(rows):
                out.append([kids[j][r] for j in range(min(lengths[r], len(kids)))]
                           if mask[r] else None)
        return out

    return build(meta["root"])


def to_object_array(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def read_selected_rows(encoded, specs, picked, batch_size, transport):
    """The rows `picked` of a ragged column, reading its offsets and null marks whole and of
    its data only the picked rows' bytes; None where the column's codec is not one this reads
    by rows (the caller decodes it whole). The offsets are checked as a whole decode would."""
    codec, meta = encoded.get("codec"), encoded.get("metadata", {})
    if codec not in ("utf8_ragged", "bytes_ragged", "msgpack_ragged", "typed_ragged") or \
            encoded.get("rows") != batch_size or "ndims" in specs or "offsets" not in specs:
        return None
    unit = np.dtype(meta["dtype"]).itemsize if codec == "typed_ragged" else 1
    data_spec = specs.get("data", {"bytes": 0, "chunks": []})
    offsets = np.frombuffer(transport.read_payload(specs["offsets"]), dtype=np.int64)
    if len(offsets) != batch_size + 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any() or \
            int(offsets[-1]) * unit != data_spec["bytes"]:
        raise ValueError("structured column: offsets do not partition its data")
    ranges, new_offsets, at = [], [0], 0
    for r in picked:
        start, end = int(offsets[r]) * unit, int(offsets[r + 1]) * unit
        if end > start:
            ranges.append((start, at, end - start))
        at += end - start
        new_offsets.append(at // unit)
    data = bytearray(at)
    if ranges:
        from ._sos_transport import address_of
        transport.read_ranges_into(data_spec, address_of(memoryview(data))[0], ranges)
    part = {"data": bytes(data), "offsets": np.asarray(new_offsets, dtype=np.int64).tobytes()}
    if "nulls" in specs:
        marks = np.frombuffer(transport.read_payload(specs["nulls"]), dtype=np.uint8)
        if len(marks) != batch_size:
            raise ValueError("structured column: nulls do not match its rows")
        part["nulls"] = marks[picked].tobytes()
    return decode_leaf(codec, part, len(picked), meta)


# -- rows --------------------------------------------------------------------------------------

def row_selection(rows, total: int):
    """(StructuredMemberSlice or None, indices or None) for get_dataproto's rows argument."""
    if rows is None:
        return None, None
    if isinstance(rows, slice):
        if rows.step is not None and rows.step <= 0:
            raise ValueError("DataProto row selection step must be positive")
        return StructuredMemberSlice(0, *slice(rows.start, rows.stop, rows.step).indices(total)), \
            None
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row selection supports only axis=0")
        if rows.step <= 0:
            raise ValueError("DataProto row selection step must be positive")
        return rows, None
    indices = list(rows) if isinstance(rows, (list, tuple, range, np.ndarray)) else None
    if indices is None or any(isinstance(i, bool) or not isinstance(i, (int, np.integer))
                              for i in indices):
        raise TypeError("rows must be a slice, a StructuredMemberSlice or a sequence of "
                        "integer row indices")
    indices = [int(i) for i in indices]
    out = []
    for i in indices:
        j = i + total if i < 0 else i
        if not 0 <= j < total:
            raise IndexError(f"row index {i} is out of range for batch size {total}")
        out.append(j)
    return None, out


def select_values(values, member_slice, indices):
    if indices is not None:
        return [values[i] for i in indices]
    if member_slice is not None:
        return values[member_slice.start:member_slice.end:member_slice.step]
    return values


def new_group_id(config) -> Optional[str]:
    raw = getattr(config, "group_ids", None)
    if raw is None:
        return f"structured-{uuid.uuid4().hex}"
    if isinstance(raw, str):
        group = raw
    else:
        try:
            ids = list(raw)
        except TypeError as error:
            raise ValueError("structured object store config.group_ids must contain strings") \
                from error
        if len(ids) > 1:
            raise ValueError("structured object store config.group_ids must contain exactly one "
                             "logical group id")
        group = ids[0] if ids else None
        if group is None:
            return f"structured-{uuid.uuid4().hex}"
    if not isinstance(group, str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return group or None


def config_with_group(config, group_id):
    """The write config of a DataProto whose objects form storage group `group_id`: the
    caller's config (copied) with that group, or a ReplicateConfig with it; a config naming
    another group is a ValueError."""
    from ._sos_transport import copy_config, grouped_config
    ids = getattr(grouped_config(config, 1), "group_ids", None)
    if ids and ids[0] and ids[0] != group_id:
        raise ValueError("config.group_ids conflicts with the DataProto storage group")
    if config is None:
        try:
            from .store import ReplicateConfig
            out = ReplicateConfig()
        except Exception:  # noqa: BLE001 - no extension: a plain object carries the group
            from types import SimpleNamespace
            out = SimpleNamespace()
    else:
        out = copy_config(config)
    out.group_ids = [group_id]
    return out


def stage_payload(stage, namespace, partition, batch_size, buffers):
    for name in (stage, namespace, partition):
        check_key_segment(name, "DataProto name")
    return StructuredObjectPayload(
        metadata={"layout": "dataproto_stage",
                  "dataproto": {"version": 1, "namespace": namespace, "partition": partition,
                                "stage": stage, "batch_size": batch_size}},
        buffers=buffers)


def merged_stage_metadata(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(old)
    specs = dict(old.get(STRUCTURED_FIELD_SPECS_KEY, {}))
    specs.update(new.get(STRUCTURED_FIELD_SPECS_KEY, {}))
    out[STRUCTURED_FIELD_SPECS_KEY] = specs
    return out


def is_torch_value(value) -> bool:
    return _torch is not None and isinstance(value, _torch.Tensor)


# -- flat dicts (put / get with type="dict") ---------------------------------------------------

def _is_dense(value) -> bool:
    if _torch is not None and isinstance(value, _torch.Tensor):
        return value.ndim > 0
    return isinstance(value, np.ndarray) and value.dtype != object and value.ndim > 0


def _is_sequence(value) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim > 0)


def schema_section(name, schema) -> Optional[str]:
    if schema is None:
        return None
    if not isinstance(schema, FieldSchema):
        raise TypeError(f"field_schemas[{name!r}] must be a FieldSchema")
    section = (schema.metadata or {}).get("section")
    if section is not None and section not in SECTIONS:
        raise ValueError(f"FieldSchema for {name!r}: section must be one of {SECTIONS}")
    return section


def flat_dict_to_envelope(data, field_schemas=None) -> Dict[str, Dict[str, Any]]:
    """Splits a flat dict: row-aligned tensors / numeric arrays -> batch, row-aligned other
    sequences -> non_tensor_batch, the rest -> meta_info (FieldSchema section pins a field)."""
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    schemas = dict(field_schemas or {})
    pinned = {k: schema_section(k, schemas.get(k)) for k in data}
    free = [k for k in data if pinned[k] is None]
    sizes = {len(data[k]) for k in free if _is_dense(data[k])}
    if len(sizes) > 1:
        raise ValueError(f"flat dict dense fields have ambiguous batch sizes: {sorted(sizes)}")
    if not sizes:
        sizes = {len(data[k]) for k in free if _is_sequence(data[k])}
        if len(sizes) > 1:
            raise ValueError(f"flat dict fields have ambiguous batch sizes: {sorted(sizes)}; "
                             "pin list-valued metadata with FieldSchema metadata['section']")
    rows = sizes.pop() if sizes else None
    out = {"batch": {}, "non_tensor_batch": {}, "meta_info": {}}
    for key, value in data.items():
        section = pinned[key]
        if section is None:
            if rows is not None and _is_dense(value) and len(value) == rows:
                section = "batch"
            elif rows is not None and _is_sequence(value) and len(value) == rows:
                section = "non_tensor_batch"
            else:
                section = "meta_info"
        if section == "non_tensor_batch" and not isinstance(value, np.ndarray):
            value = to_object_array(list(value))
        out[section][key] = value
    return out


def envelope_to_flat_dict(result: Mapping[str, Any]) -> Dict[str, Any]:
    batch, non_tensor = result.get("batch", {}), result.get("non_tensor_batch", {})
    meta = result.get("meta_info", {})
    overlap = (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) | \
        (set(batch) & set(non_tensor))
    if overlap:
        raise ValueError(f"Duplicate keys found across DataProto sections: {sorted(overlap)}")
    flat = dict(meta)
    flat.update(batch)
    for name, value in non_tensor.items():
        flat[name] = value.tolist() if isinstance(value, np.ndarray) and \
            value.dtype == object else value
    return flat
