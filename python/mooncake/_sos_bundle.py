"""Bundles for mooncake.structured_object_store: metadata bytes plus named buffers stored as
Mooncake objects under one id, and the manifest that lists them.

Key layout (upstream's, so that either wheel finds the other's bundles):

  <prefix>/<partition>/<32 hex>/manifest          JSON, below
  <prefix>/<partition>/<32 hex>/meta              the metadata bytes
  <prefix>/<partition>/<32 hex>/buffer/<name>     a buffer that fits in one chunk
  <prefix>/<partition>/<32 hex>/buffer/<name>/chunk/<i>   ... or its chunks

  manifest = {"version": 1, "layout": "bundle", "object_id": "<partition>/<32 hex>",
              "meta": PAYLOAD, "buffers": {name: PAYLOAD},
              ["buffer_object_ids": [ids whose keys buffers may use], "cleanup_keys": [...]]}
  PAYLOAD  = {"key": k, "bytes": n, "chunks": [{"key": k or k/chunk/i, "bytes": m}, ...], ...}

A manifest read from the store is checked before any key in it is used: every key must lie
under the bundle's own id (or one listed in buffer_object_ids), chunk keys under their payload's
key, sizes non-negative and adding up. So a tampered manifest can neither make a reader fetch
nor make remove_bundle delete another bundle's objects. The manifest is written last: a bundle
whose manifest exists is complete; a failed put removes what it wrote.
"""
from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._sos_transport import PayloadTransport, call_with_config, check_status, view_bytes

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024 ** 2
AUTO_PARALLEL_MIN_BYTES = DEFAULT_BUNDLE_CHUNK_BYTES  # parallel puts only for payloads this big
AUTO_PARALLEL_MIN_CHUNKS = 8                          # ... and with this many chunks
MAX_MANIFEST_BYTES = 64 * 1024 ** 2                   # a larger "manifest" is refused unread


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How payload chunks are written. max_inflight_put: chunk puts in flight at once.
    put_mode: "auto" | "batch" (one call) | "parallel". copy_mode: "auto" (registered staging
    when the store can, else put), "zero_copy" (batch_put_from or an error), "copy" (put)."""

    max_inflight_put: int = 1
    put_mode: str = "auto"
    copy_mode: str = "auto"


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest key and (when known) the manifest itself."""

    manifest_key: str
    manifest: Dict[str, Any]


@dataclass(frozen=True)
class _MultiBufferPayload:
    """One logical buffer given as several parts, written end to end."""

    buffers: Tuple[memoryview, ...]
    owners: Tuple[Any, ...] = ()
    dtype: Optional[str] = None
    shape: Optional[Tuple[int, ...]] = None

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.buffers)


# The metadata payload is small and the caller's own bytes: a plain put, whatever the policy of
# the buffers (zero_copy included).
_META_POLICY = BundleTransferPolicy(copy_mode="copy")


def check_policy(policy: Optional[BundleTransferPolicy],
                 max_inflight_put: Optional[int] = None) -> BundleTransferPolicy:
    policy = policy or BundleTransferPolicy()
    if not isinstance(policy, BundleTransferPolicy):
        raise TypeError("policy must be a BundleTransferPolicy")
    if max_inflight_put is not None:
        policy = BundleTransferPolicy(max_inflight_put, policy.put_mode, policy.copy_mode)
    if not isinstance(policy.max_inflight_put, int) or policy.max_inflight_put < 1:
        raise ValueError("max_inflight_put must be positive")
    if policy.put_mode not in ("auto", "batch", "parallel"):
        raise ValueError(f"unsupported put_mode: {policy.put_mode!r}")
    if policy.copy_mode not in ("auto", "zero_copy", "copy"):
        raise ValueError(f"unsupported copy_mode: {policy.copy_mode!r}")
    return policy


def check_chunk_bytes(chunk_bytes) -> int:
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    return chunk_bytes


def normalize_key_prefix(key_prefix: str) -> str:
    prefix = key_prefix.strip("/") if isinstance(key_prefix, str) else ""
    if not prefix or any(ord(c) < 32 for c in prefix):
        raise ValueError("key_prefix must be a non-empty key prefix")
    return prefix


def check_key_segment(value, name: str) -> None:
    if not isinstance(value, str) or not value or "/" in value or \
            any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {name}: {value!r}")


def encode_json(value: Mapping[str, Any], label: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise TypeError(f"{label} must be JSON-serializable: {error}") from error


def decode_json(payload, label: str) -> Dict[str, Any]:
    try:
        value = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{label} is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{label} must be a JSON object")
    return value


def _decode_manifest(payload) -> Dict[str, Any]:
    return decode_json(payload, "bundle manifest")


def _encode_manifest(manifest) -> bytes:
    return encode_json(manifest, "bundle manifest")


def split_parts(parts: Sequence[memoryview], chunk_bytes: int) -> List[List[memoryview]]:
    """Cuts parts laid end to end into chunks of chunk_bytes (the last may be shorter)."""
    groups, current, room = [], [], chunk_bytes
    for part in parts:
        at = 0
        while at < len(part):
            take = min(room, len(part) - at)
            current.append(part[at:at + take])
            at += take
            room -= take
            if room == 0:
                groups.append(current)
                current, room = [], chunk_bytes
    if current:
        groups.append(current)
    return groups


class BundleManifestStore:
    def __init__(self, transport: PayloadTransport, key_prefix: str, default_chunk_bytes: int):
        self.transport = transport
        self.key_prefix = key_prefix
        self.default_chunk_bytes = default_chunk_bytes

    # -- writing ---------------------------------------------------------------------------
    def put_bundle(self, meta, buffers: Mapping[str, Any], partition: str = "default",
                   chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None,
                   max_inflight_put: Optional[int] = None, config=None,
                   put_special=None) -> RemoteBundleRef:
        """put_special(key, value, policy) -> (payload spec, keys) or None lets the caller
        write values this layer does not know (tensors)."""
        check_key_segment(partition, "partition")
        chunk_bytes = check_chunk_bytes(self.default_chunk_bytes if chunk_bytes is None
                                        else chunk_bytes)
        policy = check_policy(policy, max_inflight_put)
        meta_view = view_bytes(meta, "meta")
        for name in buffers:
            check_key_segment(name, "buffer name")
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.key_prefix}/{object_id}"
        written: List[str] = []
        try:
            meta_spec = self._put_parts(f"{base}/meta", [meta_view], chunk_bytes,
                                        _META_POLICY, config, written)
            specs = {}
            for name, value in buffers.items():
                key = f"{base}/buffer/{name}"
                special = put_special(key, value, policy) if put_special else None
                if isinstance(special, tuple):
                    spec, keys = special
                    written.extend(keys)
                else:
                    value = value if special is None else special
                    parts = (list(value.buffers) if isinstance(value, _MultiBufferPayload)
                             else [view_bytes(value, name)])
                    spec = self._put_parts(key, parts, chunk_bytes, policy, config, written)
                specs[name] = spec
            manifest = {"version": 1, "layout": "bundle", "object_id": object_id,
                        "meta": meta_spec, "buffers": specs}
            self._put_manifest(f"{base}/manifest", manifest, config, written)
        except BaseException:
            self.transport.remove_keys(written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=f"{base}/manifest", manifest=manifest)

    def put_bundle_manifest(self, meta, buffer_specs: Mapping[str, Dict[str, Any]],
                            partition: str, cleanup_keys: Sequence[str] = (),
                            config=None) -> RemoteBundleRef:
        """A new bundle whose buffers are payloads written before (by other bundles); its
        metadata is new. cleanup_keys: further keys remove_bundle deletes."""
        check_key_segment(partition, "partition")
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.key_prefix}/{object_id}"
        written: List[str] = []
        try:
            meta_spec = self._put_parts(f"{base}/meta", [view_bytes(meta, "meta")],
                                        self.default_chunk_bytes, _META_POLICY, config, written)
            cleanup = list(dict.fromkeys(cleanup_keys))
            ids = {self.object_id_of(spec["key"]) for spec in buffer_specs.values()}
            ids.update(self.object_id_of(k) for k in cleanup)
            manifest = {"version": 1, "layout": "bundle", "object_id": object_id,
                        "meta": meta_spec, "buffers": dict(buffer_specs),
                        "buffer_object_ids": sorted(i for i in ids if i)}
            if cleanup:
                manifest["cleanup_keys"] = cleanup
            self.validate(manifest)
            self._put_manifest(f"{base}/manifest", manifest, config, written)
        except BaseException:
            self.transport.remove_keys(written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=f"{base}/manifest", manifest=manifest)

    def _put_manifest(self, key, manifest, config, written):
        check_status(call_with_config(self.transport.store.put, key, _encode_manifest(manifest),
                                      config=config), "put", key)
        written.append(key)

    def _put_parts(self, key, parts, chunk_bytes, policy, config, written) -> Dict[str, Any]:
        total = sum(len(p) for p in parts)
        if total == 0:
            return {"key": key, "bytes": 0, "chunks": []}
        groups = split_parts(parts, chunk_bytes)
        keys = [key] if len(groups) == 1 else [f"{key}/chunk/{i}" for i in range(len(groups))]
        self._write_groups(keys, groups, policy, config, total, written)
        return {"key": key, "bytes": total,
                "chunks": [{"key": k, "bytes": sum(len(p) for p in g)}
                           for k, g in zip(keys, groups)]}

    def _write_groups(self, keys, groups, policy, config, total, written):
        lanes = policy.max_inflight_put
        parallel = lanes > 1 and len(keys) > 1 and (
            policy.put_mode == "parallel" or (
                policy.put_mode == "auto" and len(keys) >= AUTO_PARALLEL_MIN_CHUNKS
                and total >= AUTO_PARALLEL_MIN_BYTES))
        if not parallel:
            written.extend(keys)  # cleaned up on failure, whichever of them got written
            self.transport.put_chunks(keys, groups, policy.copy_mode, config)
            return
        lanes = min(lanes, len(keys))
        step = -(-len(keys) // lanes)
        lock = threading.Lock()

        def lane(start):
            with lock:
                written.extend(keys[start:start + step])
            self.transport.put_chunks(keys[start:start + step], groups[start:start + step],
                                      policy.copy_mode, config)

        with ThreadPoolExecutor(max_workers=lanes) as pool:
            for future in [pool.submit(lane, s) for s in range(0, len(keys), step)]:
                future.result()

    # -- reading, removing -------------------------------------------------------------------
    def resolve_manifest(self, ref) -> Dict[str, Any]:
        if isinstance(ref, RemoteBundleRef):
            manifest, key = ref.manifest, ref.manifest_key
        elif isinstance(ref, Mapping):
            manifest, key = ref.get("manifest"), ref.get("manifest_key")
        else:
            raise TypeError(f"expected a RemoteBundleRef or a mapping, got {type(ref).__name__}")
        if not manifest:
            if not isinstance(key, str) or not key:
                raise ValueError("bundle ref must include manifest_key")
            manifest = self._fetch_manifest(key)
        self.validate(manifest)
        if key is not None and key != f"{self.key_prefix}/{manifest['object_id']}/manifest":
            raise ValueError("bundle manifest_key does not match manifest object_id")
        return manifest

    def _fetch_manifest(self, key: str) -> Dict[str, Any]:
        data = self.transport.store.get(key)
        if not data:
            raise KeyError(f"bundle manifest {key!r} is not in the store")
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"bundle manifest {key!r} is {len(data)} bytes, over the "
                             f"{MAX_MANIFEST_BYTES}-byte limit")
        return _decode_manifest(data)

    def manifest_key(self, ref) -> str:
        return f"{self.key_prefix}/{self.resolve_manifest(ref)['object_id']}/manifest"

    def remove_bundle(self, ref) -> None:
        manifest = self.resolve_manifest(ref)
        keys = [c["key"] for spec in [manifest["meta"], *manifest["buffers"].values()]
                for c in spec["chunks"]]
        keys.extend(manifest.get("cleanup_keys", []))
        keys.append(f"{self.key_prefix}/{manifest['object_id']}/manifest")
        self.transport.remove_keys(keys, strict=True)

    def object_id_of(self, key: str) -> Optional[str]:
        """The bundle id a key of this prefix belongs to (None: not one of ours)."""
        prefix = f"{self.key_prefix}/"
        if not isinstance(key, str) or not key.startswith(prefix):
            return None
        rest = key[len(prefix):]
        for tail in ("/manifest", "/meta"):
            if rest.endswith(tail) and rest.count("/") == 2:
                return rest[:-len(tail)]
        for marker in ("/meta/", "/buffer/"):
            at = rest.find(marker)
            if at > 0:
                return rest[:at]
        return None

    # -- validation --------------------------------------------------------------------------
    def validate(self, manifest) -> None:
        if not isinstance(manifest, dict) or manifest.get("version") != 1 or \
                manifest.get("layout") != "bundle":
            raise ValueError("invalid bundle manifest")
        object_id = manifest.get("object_id")
        if not isinstance(object_id, str) or not _is_object_id(object_id):
            raise ValueError("bundle manifest object_id must be '<partition>/<id>'")
        ids = manifest.get("buffer_object_ids", [object_id])
        if not isinstance(ids, list) or not all(isinstance(i, str) and _is_object_id(i)
                                                for i in ids):
            raise ValueError("bundle manifest buffer_object_ids must be a list of bundle ids")
        own = [f"{self.key_prefix}/{object_id}"]
        allowed = [f"{self.key_prefix}/{i}" for i in ids]
        _check_payload(manifest.get("meta"), own)
        cleanup = manifest.get("cleanup_keys", [])
        if not isinstance(cleanup, list) or not all(
                isinstance(k, str) and any(k == f"{b}/manifest" or k.startswith(f"{b}/")
                                           for b in allowed) for k in cleanup):
            raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")
        buffers = manifest.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("bundle manifest buffers must be a dict")
        for name, spec in buffers.items():
            check_key_segment(name, "buffer name")
            _check_payload(spec, allowed)


def _is_object_id(value: str) -> bool:
    parts = value.split("/")
    return len(parts) == 2 and all(parts) and ".." not in parts and \
        not any(ord(c) < 32 for c in value)


def _check_payload(spec, bases) -> None:
    if not isinstance(spec, dict):
        raise ValueError("bundle payload spec must be a dict")
    key = spec.get("key")
    if not isinstance(key, str) or not any(key.startswith(f"{b}/") for b in bases):
        raise ValueError("bundle payload key is outside the bundle namespace")
    total = spec.get("bytes")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError("bundle payload bytes must be a non-negative integer")
    chunks = spec.get("chunks")
    if not isinstance(chunks, list) or (total and not chunks):
        raise ValueError("bundle payload chunks are invalid")
    seen, added = set(), 0
    for chunk in chunks:
        if not isinstance(chunk, dict):
            raise ValueError("bundle chunk must be a dict")
        ckey, size = chunk.get("key"), chunk.get("bytes")
        if not isinstance(ckey, str) or (ckey != key and not ckey.startswith(f"{key}/")):
            raise ValueError("bundle chunk key is outside the payload namespace")
        if ckey in seen:
            raise ValueError("bundle chunk keys must be unique")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError("bundle chunk bytes must be a non-negative integer")
        seen.add(ckey)
        added += size
    if added != total:
        raise ValueError(f"bundle payload chunks total {added} bytes, expected {total}")
