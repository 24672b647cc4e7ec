"""Structured objects through the Mooncake Store: nested metadata plus many tensor, ndarray or
byte members (verl's DataProto among them), stored in chunks and read back whole, by member or
by rows. Upstream's `mooncake.structured_object_store` API, written for this package.

    from mooncake.structured_object_store import MooncakeBundleTransfer
    transfer = MooncakeBundleTransfer(store, key_prefix="rl")        # store: set up already
    ref = transfer.put_dataproto(data, stage="rollout")              # data.batch / ...
    part = transfer.get_dataproto(ref, fields=["input_ids"], rows=slice(0, 128))
    handle = export_dataproto_ref(ref)                               # JSON-safe, for another process
    transfer.cleanup_dataproto(handle)

Layers, each in its own module: _sos_transport (chunks to and from a store, using the fastest
calls it has), _sos_bundle (bundles and their manifests: key layout, validation),
_sos_structured (members and row reads), _sos_codecs and _sos_infer (per-row Python values as
columns), _sos_dataproto (stages, refs, handles). The key layout and the manifest are
upstream's; see python/README.md for what differs.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from ._sos_bundle import (AUTO_PARALLEL_MIN_BYTES, AUTO_PARALLEL_MIN_CHUNKS,  # noqa: F401
                          DEFAULT_BUNDLE_CHUNK_BYTES, BundleManifestStore, BundleTransferPolicy,
                          RemoteBundleRef, _decode_manifest, _encode_manifest, encode_json,
                          _MultiBufferPayload, check_chunk_bytes, check_policy,
                          normalize_key_prefix)
from ._sos_codecs import (_decode_msgpack_ragged_values, _encode_msgpack_ragged_values,  # noqa
                          _EncodedStructuredLeaf)
from ._sos_dataproto import (DATAPROTO_REF_HANDLE_TYPE, DATAPROTO_REF_HANDLE_VERSION,  # noqa
                             STORAGE_GROUP_ID, FieldSchema, MooncakeDataProtoRef,
                             config_with_group, encode_with_schema, read_selected_rows,
                             StructuredFieldLocation, _object_column, batch_size_of,
                             decode_non_tensor, encode_non_tensor, envelope_to_flat_dict,
                             export_dataproto_ref, flat_dict_to_envelope, schema_section,
                             import_dataproto_ref, is_dataproto_ref_handle, merged_stage_metadata,
                             new_group_id, resolve_ref, row_selection, select_values,
                             split_dataproto_like, stage_payload, to_object_array)
from ._sos_infer import (MISSING, _choose_leaf_codec, _CodecDecision, _escape_key,  # noqa: F401
                         _InferredLeaf, _InferredNode, infer_structure)
from ._sos_structured import (STRUCTURED_FIELD_SPECS_KEY, StructuredMemberSlice,  # noqa: F401
                              StructuredObjectLayer, StructuredObjectPayload,
                              StructuredObjectReadSpec, StructuredObjectResult, _TensorPayload,
                              _TensorObjectBufferPayload, _RawDestinationBuffer, raw_destination,
                              tensor_object_buffer)
from ._sos_transport import MISSING_OBJECT_ERROR, PayloadTransport  # noqa: F401
from ._sos_transport import grouped_config as _config_for_grouped_keys  # noqa: F401

export_ref = export_dataproto_ref
import_ref = import_dataproto_ref
_concat_arrays_into = None  # upstream's C fast-copy extension: not built here

__all__ = [
    "BundleTransferPolicy", "FieldSchema", "MISSING", "MooncakeBundleTransfer",
    "MooncakeDataProtoRef", "RemoteBundleRef", "StructuredFieldLocation",
    "StructuredMemberSlice", "StructuredObjectPayload", "StructuredObjectReadSpec",
    "StructuredObjectResult", "export_dataproto_ref", "export_ref", "import_dataproto_ref",
    "import_ref", "infer_structure", "is_dataproto_ref_handle", "raw_destination",
    "tensor_object_buffer",
]


class MooncakeBundleTransfer:
    """Stores structured objects and DataProto-like batches in a Mooncake store."""

    def __init__(self, store, key_prefix: str = "bundle",
                 default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES, buffer_pool=None):
        self.store = store
        self.key_prefix = normalize_key_prefix(key_prefix)
        self.default_chunk_bytes = check_chunk_bytes(default_chunk_bytes)
        self.buffer_pool = buffer_pool
        self._transport = PayloadTransport(store, buffer_pool)
        self._bundles = BundleManifestStore(self._transport, self.key_prefix,
                                            self.default_chunk_bytes)
        self._structured = StructuredObjectLayer(self._bundles, buffer_pool)

    # -- bundles ---------------------------------------------------------------------------
    def put_bundle(self, meta, buffers: Mapping[str, Any], partition: str = "default",
                   chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None,
                   max_inflight_put: Optional[int] = None, config=None) -> RemoteBundleRef:
        """Raw metadata bytes plus named bytes-like buffers, as one bundle."""
        return self._bundles.put_bundle(meta, buffers, partition, chunk_bytes, policy,
                                        max_inflight_put, config)

    def remove_bundle(self, ref) -> None:
        """Removes every object of a bundle (payload chunks, metadata, manifest)."""
        self._bundles.remove_bundle(ref)

    # -- structured objects ----------------------------------------------------------------
    def put_structured_object(self, payload: StructuredObjectPayload, partition: str = "default",
                              chunk_bytes: Optional[int] = None,
                              policy: Optional[BundleTransferPolicy] = None,
                              max_inflight_put: Optional[int] = None,
                              config=None) -> RemoteBundleRef:
        return self._structured.put(payload, partition, chunk_bytes, policy, max_inflight_put,
                                    config)

    def put_object(self, obj, partition: str = "default", chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None,
                   max_inflight_put: Optional[int] = None, config=None) -> RemoteBundleRef:
        """A mapping of members, or one tensor / ndarray / bytes value."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload(metadata={}, buffers=obj)
        else:
            payload = StructuredObjectPayload(metadata={"__mooncake_wrapped_object__": True},
                                              buffers={"value": obj})
        return self.put_structured_object(payload, partition, chunk_bytes, policy,
                                          max_inflight_put, config)

    def get_object(self, ref):
        result = self.materialize(self.read_spec(ref))
        if result.metadata.get("__mooncake_wrapped_object__"):
            return result.objects["value"]
        return result.objects

    def read_spec(self, ref) -> StructuredObjectReadSpec:
        return self._structured.read_spec(ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        return self._structured.materialize(spec)

    def materialize_into(self, spec: StructuredObjectReadSpec,
                         destinations: Optional[Mapping[str, Any]]) -> StructuredObjectResult:
        """As materialize, writing members into the given arrays / raw destinations."""
        return self._structured.materialize(spec, destinations)

    @staticmethod
    def release_result(result) -> None:
        """Gives back the BufferPool leases behind a result's arrays (once each)."""
        seen_owners, seen = set(), set()

        def visit(value):
            owner = getattr(value, "_mooncake_pool_owner", None)
            if owner is not None:
                if id(owner) not in seen_owners:
                    seen_owners.add(id(owner))
                    owner.release()
                return
            if isinstance(value, Mapping):
                items = value.values()
            elif isinstance(value, (list, tuple)):
                items = value
            elif isinstance(value, np.ndarray) and value.dtype == object:
                items = value.flat
            elif isinstance(value, StructuredObjectResult):
                items = value.objects.values()
            else:
                return
            if id(value) in seen:
                return
            seen.add(id(value))
            for item in items:
                visit(item)

        visit(result)

    # -- DataProto -------------------------------------------------------------------------
    def put(self, data, *, type: str = "dataproto", namespace: str = "default",
            partition: str = "default", stage: str = "default",
            chunk_bytes: Optional[int] = None, policy: Optional[BundleTransferPolicy] = None,
            config=None, field_schemas: Optional[Mapping[str, FieldSchema]] = None
            ) -> MooncakeDataProtoRef:
        """A DataProto-like object (type="dataproto") or a flat dict (type="dict": row-aligned
        tensors and arrays become batch fields, other row-aligned sequences non_tensor_batch
        fields, the rest meta_info)."""
        if type == "dict":
            data = flat_dict_to_envelope(data, field_schemas)
        elif type != "dataproto":
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        return self._put_stage(None, data, namespace=namespace, partition=partition,
                               stage=stage, chunk_bytes=chunk_bytes, policy=policy,
                               overwrite=False, config=config, field_schemas=field_schemas)

    def get(self, ref, *, type: str = "dataproto", fields=None, batch_fields=None,
            non_tensor_fields=None, meta_info_keys=None, data_cls=None, destinations=None,
            rows=None):
        """get_dataproto's result, or with type="dict" one flat dict (non_tensor_batch object
        arrays as lists)."""
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        result = self.get_dataproto(ref, fields=fields, batch_fields=batch_fields,
                                    non_tensor_fields=non_tensor_fields,
                                    meta_info_keys=meta_info_keys,
                                    data_cls=dict if type == "dict" else data_cls,
                                    destinations=destinations, rows=rows)
        return envelope_to_flat_dict(result) if type == "dict" else result

    def put_dataproto(self, data, *, namespace: str = "default", partition: str = "default",
                      stage: str = "default", chunk_bytes: Optional[int] = None,
                      policy: Optional[BundleTransferPolicy] = None,
                      field_schemas: Optional[Mapping[str, FieldSchema]] = None,
                      config=None) -> MooncakeDataProtoRef:
        return self.put(data, type="dataproto", namespace=namespace, partition=partition,
                        stage=stage, chunk_bytes=chunk_bytes, policy=policy, config=config,
                        field_schemas=field_schemas)

    def append_dataproto_fields(self, ref, data, *, stage: str, overwrite: bool = False,
                                chunk_bytes: Optional[int] = None,
                                policy: Optional[BundleTransferPolicy] = None,
                                field_schemas: Optional[Mapping[str, FieldSchema]] = None,
                                config=None) -> MooncakeDataProtoRef:
        """Writes more fields as (or into) a stage; existing fields are never rewritten.
        overwrite=True replaces a whole stage (every field it had must be given)."""
        ref = resolve_ref(ref)
        return self._put_stage(ref, data, namespace=ref.namespace, partition=ref.partition,
                               stage=stage, chunk_bytes=chunk_bytes, policy=policy,
                               overwrite=overwrite, config=config, field_schemas=field_schemas)

    def get_dataproto(self, ref, *, fields: Optional[Sequence[str]] = None,
                      batch_fields: Optional[Sequence[str]] = None,
                      non_tensor_fields: Optional[Sequence[str]] = None,
                      meta_info_keys: Optional[Sequence[str]] = None, data_cls=None,
                      destinations: Optional[Mapping[str, Any]] = None, rows=None):
        ref = resolve_ref(ref)
        names = _select_fields(ref, fields, batch_fields, non_tensor_fields)
        meta = _select_meta(ref.meta_info, meta_info_keys)
        member_slice, indices = row_selection(rows, ref.batch_size)
        destinations = dict(destinations or {})
        unknown = sorted(set(destinations) - set(names))
        if unknown:
            raise ValueError(f"destinations name fields that are not read: {unknown}")
        out = {"batch": {}, "non_tensor_batch": {}}
        stages = {}
        for name in names:
            loc = ref.field_index[name]
            manifest, specs = self._stage(ref, loc.stage, stages)
            value = self._read_field(name, loc, manifest, specs, ref, member_slice, indices,
                                     destinations.get(name))
            out[loc.section][name] = value
        return _build_result(out["batch"], out["non_tensor_batch"], meta, data_cls)

    def dataproto_manifest_view(self, ref) -> Dict[str, Any]:
        """Each field's stage, member and stored spec, read from the stage manifests."""
        ref = resolve_ref(ref)
        stages = {}
        view = {"batch_size": ref.batch_size, "namespace": ref.namespace,
                "partition": ref.partition, "meta_info": dict(ref.meta_info),
                "meta_info_keys": list(ref.meta_info), "stages": {},
                "batch_fields": {}, "non_tensor_fields": {}}
        for stage, stage_ref in ref.stage_refs.items():
            self._stage(ref, stage, stages)
            view["stages"][stage] = {"manifest_key": stage_ref.manifest_key,
                                     "dataproto": stages[stage][2].get("dataproto", {})}
        for name, loc in ref.field_index.items():
            _manifest, specs = self._stage(ref, loc.stage, stages)
            spec = ref.encoded_non_tensor.get(name) or specs.get(loc.member, {})
            key = "batch_fields" if loc.section == "batch" else "non_tensor_fields"
            view[key][name] = {"stage": loc.stage, "member": loc.member, "spec": spec}
        return view

    def cleanup_dataproto(self, ref) -> None:
        """Removes every stage object of the ref (or exported handle)."""
        ref = resolve_ref(ref)
        errors = []
        for stage_ref in ref.stage_refs.values():
            try:
                self._bundles.remove_bundle(stage_ref)
            except KeyError:
                continue  # removed already
            except Exception as error:  # noqa: BLE001 - all stages are tried
                errors.append(f"{stage_ref.manifest_key}: {error}")
        if errors:
            raise RuntimeError("cleanup_dataproto failed for " + "; ".join(errors))

    # -- DataProto internals -----------------------------------------------------------------
    def _stage(self, ref, stage, cache):
        if stage not in cache:
            stage_ref = ref.stage_refs.get(stage)
            if stage_ref is None:
                raise ValueError(f"DataProto ref has no stage {stage!r}")
            manifest = self._bundles.resolve_manifest(stage_ref)
            metadata = self._structured.read_metadata(manifest)
            cache[stage] = (manifest, metadata.get(STRUCTURED_FIELD_SPECS_KEY, {}), metadata)
        return cache[stage][:2]

    def _read_field(self, name, loc, manifest, specs, ref, member_slice, indices, destination):
        encoded = ref.encoded_non_tensor.get(name)
        if encoded is None:
            payload = manifest["buffers"].get(loc.member)
            if payload is None:
                raise ValueError(f"DataProto field {name!r}: member {loc.member!r} is not in "
                                 "its stage object")
            return self._structured.read_member(payload, specs.get(loc.member, {}),
                                                member_slice, indices, destination)
        if destination is not None:
            raise ValueError(f"DataProto field {name!r} is encoded per row and does not "
                             "support destinations")
        specs_of = {}
        for part, member in encoded.get("payload_members", {}).items():
            if member not in manifest["buffers"]:
                raise ValueError(f"DataProto field {name!r}: member {member!r} is missing")
            specs_of[part] = manifest["buffers"][member]
        if member_slice is not None or indices is not None:
            offsets = specs_of.get("offsets")
            if offsets is not None:  # a handle's batch_size must be the column's own
                self._transport.check_stored(offsets)
                if offsets["bytes"] != 8 * (ref.batch_size + 1):
                    raise ValueError(f"DataProto field {name!r} holds "
                                     f"{max(offsets['bytes'] // 8 - 1, 0)} rows; the ref says "
                                     f"batch_size {ref.batch_size}")
            picked = (list(indices) if indices is not None else
                      list(range(member_slice.start, member_slice.end, member_slice.step)))
            rows = read_selected_rows(encoded, specs_of, picked, ref.batch_size,
                                      self._transport)
            if rows is not None:
                return to_object_array(rows)
        parts = {p: self._transport.read_payload(spec) for p, spec in specs_of.items()}
        values = decode_non_tensor(encoded, parts)
        if len(values) != ref.batch_size:
            raise ValueError(f"DataProto field {name!r} has {len(values)} rows, expected "
                             f"{ref.batch_size}")
        return to_object_array(select_values(values, member_slice, indices))

    def _put_stage(self, ref, data, *, namespace, partition, stage, chunk_bytes, policy,
                   overwrite, config, field_schemas=None):
        batch, non_tensor, meta_info = split_dataproto_like(data)
        _check_schemas(field_schemas, batch, non_tensor, meta_info)
        batch_size = batch_size_of(batch, non_tensor)
        if ref is not None and (batch or non_tensor) and batch_size != ref.batch_size:
            raise ValueError(f"DataProto append batch size {batch_size} does not match ref "
                             f"batch size {ref.batch_size}")
        overlap = sorted(set(batch) & set(non_tensor))
        if overlap:
            raise ValueError(f"DataProto batch and non_tensor_batch fields overlap: {overlap}")
        buffers, updates, encoded_updates = {}, {}, {}
        for name, value in batch.items():
            buffers[f"batch.{name}"] = value
            updates[name] = StructuredFieldLocation(stage, f"batch.{name}", "batch")
        for name, value in non_tensor.items():
            member = f"non_tensor_batch.{name}"
            column = _object_column(value)
            schema = (field_schemas or {}).get(name)
            forced = schema is not None and schema.codec != "auto" and \
                schema_section(name, schema) in (None, "non_tensor_batch")
            if column.dtype != object and not forced:
                buffers[member] = column
            else:
                encoded = (encode_with_schema(name, column, schema) if forced
                           else encode_non_tensor(member, column))
                members = {}
                for part, data_part in encoded.payload.items():
                    buffers[f"{member}.{part}"] = data_part
                    members[part] = f"{member}.{part}"
                encoded_updates[name] = {"codec": encoded.codec, "rows": encoded.rows,
                                         "metadata": encoded.metadata,
                                         "payload_members": members}
            updates[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
        if ref is not None:
            duplicates = sorted(set(ref.field_index) & set(updates))
            if duplicates and not overwrite:
                raise ValueError(f"DataProto fields already exist: {duplicates}")
            if overwrite:
                dangling = sorted(n for n, l in ref.field_index.items()
                                  if l.stage == stage and n not in updates)
                if dangling:
                    raise ValueError(f"DataProto overwrite for stage {stage!r} must include "
                                     f"existing fields: {dangling}")
        group = new_group_id(config) if ref is None else ref._storage_group_id
        if not buffers:
            base = ref or MooncakeDataProtoRef(batch_size, {}, {}, {}, namespace, partition,
                                               _storage_group_id=group)
            merged = dict(base.meta_info)
            merged.update(meta_info)
            return MooncakeDataProtoRef(base.batch_size, dict(base.stage_refs),
                                        dict(base.field_index), merged, base.namespace,
                                        base.partition, base.global_indexes,
                                        dict(base.encoded_non_tensor), base._storage_group_id)
        if group is not None:
            config = config_with_group(config, group)  # checked before anything is written
        payload = stage_payload(stage, namespace, partition, batch_size, buffers)
        old = ref.stage_refs.get(stage) if ref is not None else None
        stage_ref = self.put_structured_object(payload, partition, chunk_bytes, policy,
                                               config=config)
        if old is not None and not overwrite:
            stage_ref = self._merge_stage(old, stage_ref, partition, config)
        elif old is not None:
            self._bundles.remove_bundle(old)
        stage_refs = dict(ref.stage_refs) if ref else {}
        stage_refs[stage] = stage_ref
        field_index = dict(ref.field_index) if ref else {}
        field_index.update(updates)
        merged_meta = dict(ref.meta_info) if ref else {}
        merged_meta.update(meta_info)
        encoded_all = dict(ref.encoded_non_tensor) if ref else {}
        for name in updates:
            encoded_all.pop(name, None)
        encoded_all.update(encoded_updates)
        return MooncakeDataProtoRef(batch_size if ref is None else ref.batch_size, stage_refs,
                                    field_index, merged_meta, namespace, partition,
                                    None if ref is None else ref.global_indexes, encoded_all,
                                    group)

    def _merge_stage(self, old_ref, new_ref, partition, config):
        """One manifest for a stage written in two parts: both parts' members, both parts'
        metadata objects to clean up with it."""
        old = self._bundles.resolve_manifest(old_ref)
        new = self._bundles.resolve_manifest(new_ref)
        old_meta = self._structured.read_metadata(old)
        new_meta = self._structured.read_metadata(new)
        buffers = dict(old["buffers"])
        buffers.update(new["buffers"])
        cleanup = list(old.get("cleanup_keys", []))
        for manifest in (old, new):
            cleanup.append(f"{self.key_prefix}/{manifest['object_id']}/manifest")
            cleanup.extend(c["key"] for c in manifest["meta"]["chunks"])
        merged = self._bundles.put_bundle_manifest(
            encode_json(merged_stage_metadata(old_meta, new_meta), "structured metadata"),
            buffers, partition, cleanup, config)
        return merged


def _check_schemas(field_schemas, batch, non_tensor, meta_info):
    """FieldSchema hints: a pinned section must be the field's section, and a field that is
    not nullable must have no None row. (Codecs are applied where the field is encoded.)"""
    for name, schema in (field_schemas or {}).items():
        section = schema_section(name, schema)
        where = [s for s, d in (("batch", batch), ("non_tensor_batch", non_tensor),
                                ("meta_info", meta_info)) if name in d]
        if not where:
            continue
        if section is not None and section not in where:
            raise ValueError(f"FieldSchema for {name!r} declares section {section!r}, but the "
                             f"field is in {where[0]}")
        if section is not None and section != "non_tensor_batch":
            continue  # a schema of another section's field of that name
        if not schema.nullable and where[0] == "non_tensor_batch" and any(
                v is None for v in non_tensor[name]):
            raise ValueError(f"FieldSchema for {name!r} is not nullable, and a row is None")


def _select_fields(ref, fields, batch_fields, non_tensor_fields):
    if fields is None and batch_fields is None and non_tensor_fields is None:
        return list(ref.field_index)
    if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
        raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
    unknown = [n for n in list(fields or []) + list(batch_fields or []) +
               list(non_tensor_fields or []) if n not in ref.field_index]
    if unknown:
        raise KeyError(f"unknown DataProto fields {unknown} (the ref has "
                       f"{sorted(ref.field_index)})")
    names = []
    for group, section in ((fields, None), (batch_fields, "batch"),
                           (non_tensor_fields, "non_tensor_batch")):
        for name in group or []:
            loc = ref.field_index[name]  # every name was checked above
            if section is not None and loc.section != section:
                raise ValueError(f"DataProto field {name!r} is a {loc.section} field, not "
                                 f"{section}")
            if name not in names:
                names.append(name)
    return names


def _select_meta(meta_info, keys):
    if keys is None:
        return dict(meta_info)
    missing = [k for k in keys if k not in meta_info]
    if missing:
        raise KeyError(f"meta_info keys not in the ref: {missing}")
    return {k: meta_info[k] for k in keys}


def _build_result(batch, non_tensor, meta, data_cls):
    if data_cls is None or data_cls is dict:
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
    from_dict = getattr(data_cls, "from_dict", None)
    if callable(from_dict):
        return from_dict(batch, non_tensor, meta_info=meta)
    try:
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
    except TypeError as error:
        raise TypeError(f"data_cls {getattr(data_cls, '__name__', data_cls)!r} cannot be "
                        "constructed: it takes neither from_dict(batch, non_tensor_batch, "
                        "meta_info=...) nor (batch=..., non_tensor_batch=..., meta_info=...)") \
            from error
