"""mooncake.structured_object_store: structure inference, the column codecs, bundles and their
manifests (including manifests an attacker wrote), structured objects and DataProto batches,
first against a dict-backed store (each capability on or off), then against a real master with
the objects in another process, which also reads a handle exported here."""
import json

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("msgpack")

import mooncake.structured_object_store as sos  # noqa: E402
from mooncake.structured_object_store import (MISSING, BundleTransferPolicy,  # noqa: E402
                                              MooncakeBundleTransfer, RemoteBundleRef,
                                              StructuredObjectPayload, export_dataproto_ref,
                                              import_dataproto_ref, infer_structure)
from store_helpers import store_fixtures  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class DictStore:
    """put / get / remove over a dict; fail_put_at: the n-th put raises."""

    def __init__(self, fail_put_at=None):
        self.objects, self.puts, self.fail_put_at = {}, 0, fail_put_at

    def put(self, key, value, config=None):
        self.puts += 1
        if self.puts == self.fail_put_at:
            raise RuntimeError("injected put failure")
        self.objects[key] = bytes(value)
        return 0

    def get(self, key):
        return self.objects.get(key, b"")

    def remove(self, key, force=False):
        return 0 if self.objects.pop(key, None) is not None else -704

    def get_size(self, key):
        return len(self.objects[key]) if key in self.objects else -704


def transfer(store=None, **kw):
    store = store if store is not None else DictStore()
    return store, MooncakeBundleTransfer(store, key_prefix="t", **kw)


# ---- inference and codecs ----

@pytest.mark.parametrize("values,codec,accepted", [
    ([1, 2.5, None], "ndarray", True),
    ([[1, 2], [3]], "typed_ragged", True),
    ([b"a", bytearray(b"b")], "bytes_ragged", True),
    (["a", None, "b"], "utf8_ragged", True),
    ([{"a": 1}, [2]], "msgpack_ragged", True),
    ([{"a": object()}], "msgpack_ragged", False),   # does not pack: refused, not failed later
    ([None, None], "msgpack_ragged", False),
    ([object()], "msgpack_ragged", False),
])
def test_leaf_codec_choice(values, codec, accepted):
    decision = sos._choose_leaf_codec(values)
    assert (decision.codec, decision.accepted) == (codec, accepted)


def test_inference_keeps_missing_keys_apart_from_none_and_limits_depth():
    leaves, nodes = [], []
    infer_structure("r", [{"x": None}, {"y": 2}, None], leaves, nodes)
    x = next(leaf for leaf in leaves if leaf.path == "r.x")
    assert x.values[0] is None and x.values[1] is MISSING and x.values[2] is None
    assert nodes[0].row_mask == [True, True, False]
    deep = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="deeper"):
        infer_structure("r", [deep], [], [])
    assert sos._escape_key("a.b[c\\") == "a\\.b\\[c\\\\"


@pytest.mark.parametrize("rows", [
    [1, None, 3],
    [[1, 2], None, [3, 4, 5], []],
    [np.arange(6, dtype=np.int32).reshape(2, 3), None, np.arange(2, dtype=np.int32)],
    [b"x", None, b"", b"yz"],
    ["h\u00e9llo", None, ""],
    [{"a": [1, 2]}, None, {"b": {"c": "d"}}],
])
def test_column_codecs_round_trip(rows):
    from mooncake._sos_dataproto import decode_non_tensor, encode_non_tensor, to_object_array
    column = to_object_array(rows)
    encoded = encode_non_tensor("f", column)
    parts = {k: bytes(np.ascontiguousarray(v).view(np.uint8)) if isinstance(v, np.ndarray)
             else bytes(v) for k, v in encoded.payload.items()}
    meta = json.loads(json.dumps({"codec": encoded.codec, "rows": encoded.rows,
                                  "metadata": encoded.metadata}))  # as stored: JSON
    back = decode_non_tensor(meta, parts)
    for got, want in zip(back, rows):
        if isinstance(want, np.ndarray):
            assert np.array_equal(got, want) and got.dtype == want.dtype
        else:
            assert got == want


@needs_torch
def test_ragged_tensor_rows_keep_dtype_shape_and_bfloat16():
    from mooncake._sos_dataproto import decode_non_tensor, encode_non_tensor, to_object_array
    rows = [torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), None,
            torch.zeros(0, 3, dtype=torch.bfloat16)]
    encoded = encode_non_tensor("f", to_object_array(rows))
    assert encoded.codec == "ragged_tensor"
    parts = {k: bytes(np.ascontiguousarray(v).view(np.uint8)) if isinstance(v, np.ndarray)
             else bytes(v) for k, v in encoded.payload.items()}
    back = decode_non_tensor({"codec": encoded.codec, "rows": 3,
                              "metadata": encoded.metadata}, parts)
    assert torch.equal(back[0], rows[0]) and back[1] is None
    assert back[2].shape == (0, 3) and back[2].dtype == torch.bfloat16


def test_column_decoders_refuse_lying_offsets():
    """Columns come from the store, so from any client: offsets past the data, decreasing
    offsets or a wrong row count are a ValueError, never a read past the buffer."""
    from mooncake._sos_codecs import decode_leaf
    data = b"abcdef"
    bad = [np.array([0, 2, 100], np.int64), np.array([0, 4, 2, 6], np.int64)[:3],
           np.array([0, 7], np.int64), np.array([1, 6], np.int64)]
    for offsets in bad:
        rows = len(offsets) - 1
        with pytest.raises(ValueError):
            decode_leaf("bytes_ragged", {"data": data, "offsets": offsets.tobytes()}, rows, {})
    with pytest.raises(ValueError, match="rows"):
        decode_leaf("ndarray", {"data": np.arange(3).tobytes()}, 4, {"dtype": "<i8"})
    with pytest.raises(ValueError, match="object"):
        decode_leaf("ndarray", {"data": b"\0" * 8}, 1, {"dtype": "|O"})


# ---- bundles and manifests ----

def test_bundle_key_layout_chunks_and_remove():
    store, t = transfer(default_chunk_bytes=5)
    ref = t.put_bundle(b"meta", {"payload": bytes(range(12)), "empty": b""})
    base = ref.manifest_key[:-len("/manifest")]
    assert base.startswith("t/default/") and len(base.split("/")[-1]) == 32
    chunks = ref.manifest["buffers"]["payload"]["chunks"]
    assert [c["bytes"] for c in chunks] == [5, 5, 2]
    assert [c["key"] for c in chunks] == [f"{base}/buffer/payload/chunk/{i}" for i in range(3)]
    assert ref.manifest["buffers"]["empty"] == {"key": f"{base}/buffer/empty", "bytes": 0,
                                                "chunks": []}
    assert json.loads(store.objects[ref.manifest_key]) == ref.manifest
    t.remove_bundle({"manifest_key": ref.manifest_key})
    assert store.objects == {}


def test_failed_put_removes_what_it_wrote():
    store, t = transfer(DictStore(fail_put_at=3))
    with pytest.raises(RuntimeError, match="injected"):
        t.put_bundle(b"meta", {"payload": b"abcdef"}, chunk_bytes=2)
    assert store.objects == {}


@pytest.mark.parametrize("tamper,match", [
    (lambda m: m["buffers"]["p"]["chunks"].__setitem__(0, {"key": "victim", "bytes": 6}),
     "namespace"),
    (lambda m: m["buffers"]["p"].__setitem__("key", "t/other/x/buffer/p"), "namespace"),
    (lambda m: m["buffers"]["p"]["chunks"][0].__setitem__("bytes", 7), "expected"),
    (lambda m: m["buffers"]["p"]["chunks"][0].__setitem__("bytes", -1), "non-negative"),
    (lambda m: m.__setitem__("cleanup_keys", ["victim"]), "cleanup_keys"),
    (lambda m: m.__setitem__("object_id", "../x"), "object_id"),
    (lambda m: m.__setitem__("buffer_object_ids", ["default/other", 3]), "buffer_object_ids"),
])
def test_tampered_manifest_is_refused_before_any_key_is_used(tamper, match):
    store, t = transfer()
    ref = t.put_bundle(b"meta", {"p": b"abcdef"})
    store.objects["victim"] = b"not yours"
    manifest = json.loads(store.objects[ref.manifest_key])
    tamper(manifest)
    store.objects[ref.manifest_key] = json.dumps(manifest).encode()
    handle = {"manifest_key": ref.manifest_key}
    with pytest.raises(ValueError, match=match):
        t.materialize(t.read_spec(handle))
    with pytest.raises(ValueError, match=match):
        t.remove_bundle(handle)
    assert store.objects["victim"] == b"not yours"


def test_metadata_size_from_a_manifest_is_bounded_before_allocation():
    store, t = transfer()
    ref = t.put_structured_object(StructuredObjectPayload({}, {"p": b"abc"}))
    manifest = json.loads(store.objects[ref.manifest_key])
    manifest["meta"]["bytes"] = manifest["meta"]["chunks"][0]["bytes"] = 1 << 40
    store.objects[ref.manifest_key] = json.dumps(manifest).encode()
    with pytest.raises(ValueError, match="limit"):
        t.materialize(t.read_spec({"manifest_key": ref.manifest_key}))


def test_a_manifest_claiming_more_than_was_stored_allocates_nothing():
    store, t = transfer()
    ref = t.put_structured_object(StructuredObjectPayload({}, {"p": b"abcdef"}))
    manifest = json.loads(store.objects[ref.manifest_key])
    big = 8 << 30  # 8 GiB claimed, 6 bytes stored
    manifest["buffers"]["p"]["bytes"] = manifest["buffers"]["p"]["chunks"][0]["bytes"] = big
    store.objects[ref.manifest_key] = json.dumps(manifest).encode()
    with pytest.raises(ValueError, match="holds 6 bytes in the store"):
        t.materialize(t.read_spec({"manifest_key": ref.manifest_key}))


def test_a_handle_with_a_forged_batch_size_is_refused_before_rows_are_listed():
    _store, t = transfer()
    ref = t.put_dataproto({"non_tensor_batch": {"s": np.asarray(["a", "b"], dtype=object)}})
    handle = {**export_dataproto_ref(ref), "batch_size": 10 ** 15}
    with pytest.raises(ValueError, match="holds 2 rows"):
        t.get_dataproto(handle, rows=slice(None))


def test_manifest_key_must_match_its_object_id_and_garbage_is_an_error():
    store, t = transfer()
    ref = t.put_bundle(b"m", {"p": b"x"})
    with pytest.raises(ValueError, match="manifest_key"):
        t.remove_bundle(RemoteBundleRef("t/default/other/manifest", ref.manifest))
    store.objects["t/default/bad/manifest"] = b"\xff not json"
    with pytest.raises(ValueError, match="JSON"):
        t.read_spec({"manifest_key": "t/default/bad/manifest"}) and \
            t.materialize(t.read_spec({"manifest_key": "t/default/bad/manifest"}))
    with pytest.raises(KeyError, match="not in the store"):
        t.materialize(t.read_spec({"manifest_key": "t/default/none/manifest"}))


def test_policy_and_names_are_checked():
    _store, t = transfer()
    with pytest.raises(ValueError, match="max_inflight_put"):
        t.put_bundle(b"m", {"p": b"x"}, max_inflight_put=0)
    with pytest.raises(ValueError, match="copy_mode"):
        t.put_bundle(b"m", {"p": b"x"}, policy=BundleTransferPolicy(copy_mode="fast"))
    with pytest.raises(ValueError, match="buffer name"):
        t.put_bundle(b"m", {"a/b": b"x"})
    with pytest.raises(RuntimeError, match="zero-copy"):
        t.put_bundle(b"m", {"p": b"x"}, policy=BundleTransferPolicy(copy_mode="zero_copy"))


# ---- structured objects on the dict store ----

def test_structured_members_rows_and_destinations():
    store, t = transfer(default_chunk_bytes=24)
    weights = np.arange(120, dtype=np.int32).reshape(15, 8)
    ref = t.put_structured_object(StructuredObjectPayload({"kind": "w"},
                                                          {"w": weights, "raw": b"abc"}))
    result = t.materialize(t.read_spec(ref))
    assert result.metadata["kind"] == "w" and result.metadata["layout"] == "structured"
    assert np.array_equal(result.objects["w"], weights) and result.objects["raw"] == b"abc"
    spec = t.read_spec(ref).select_members(["w"]).slice_member("w", 0, 1, 12, 3)
    assert np.array_equal(t.materialize(spec).objects["w"], weights[1:12:3])
    out = np.empty((4, 8), dtype=np.int32)
    got = t.materialize_into(t.read_spec(ref).slice_member("w", 0, 10, 14), {"w": out})
    assert got.objects["w"] is out and np.array_equal(out, weights[10:14])
    with pytest.raises(ValueError, match="axis=0"):
        t.materialize(t.read_spec(ref).slice_member("w", 1, 0, 2))
    with pytest.raises(ValueError, match="does not support slicing"):
        t.materialize(t.read_spec(ref).slice_member("raw", 0, 0, 1))
    with pytest.raises(ValueError, match="shape mismatch"):
        t.materialize_into(t.read_spec(ref), {"w": np.empty((3, 8), np.int32)})
    with pytest.raises(ValueError, match="reserved"):
        t.put_structured_object(StructuredObjectPayload(
            {"__mooncake_structured_fields__": {}}, {"p": b""}))


@needs_torch
def test_tensors_round_trip_without_tensor_calls():
    _store, t = transfer()
    values = {"f": torch.arange(12, dtype=torch.float32).reshape(3, 4),
              "bf": torch.ones(2, 2, dtype=torch.bfloat16),
              "scalar": torch.tensor(1.5), "flags": torch.tensor([True, False])}
    back = t.get_object(t.put_object(values))
    for name, tensor in values.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    one = t.get_object(t.put_object(torch.arange(5)))
    assert torch.equal(one, torch.arange(5))


@needs_torch
def test_jagged_nested_tensors_keep_their_rows_and_layout():
    _store, t = transfer()
    rows = [torch.arange(2), torch.arange(10, 14), torch.arange(20, 21)]
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    ref = t.put_dataproto({"batch": {"tokens": nested}})
    assert ref.batch_size == 3
    for selection, want in ((None, rows), (slice(1, 3), rows[1:]), ([2, 0], [rows[2], rows[0]]),
                            ([], [])):
        got = t.get_dataproto(ref, rows=selection)["batch"]["tokens"]
        assert got.is_nested and len(got) == len(want) and got.layout == torch.jagged
        for a, b in zip(got.unbind(), want):
            assert torch.equal(a, b)
    matrix = [torch.arange(6).reshape(2, 3), torch.arange(10).reshape(2, 5)]
    got = t.get_dataproto(t.put_dataproto({"batch": {"pos": torch.nested.as_nested_tensor(
        matrix, layout=torch.jagged)}}))["batch"]["pos"]
    assert got._ragged_idx == 2
    assert all(torch.equal(a, b) for a, b in zip(got.unbind(), matrix))


def test_dataproto_stages_rows_handles_and_cleanup():
    store, t = transfer()
    data = {"batch": {"ids": np.arange(12, dtype=np.int64).reshape(4, 3)},
            "non_tensor_batch": {"text": np.asarray(["a", None, "c", "d"], dtype=object),
                                 "score": np.asarray([0.5, 1, 2, 3], dtype=np.float32),
                                 "info": np.asarray([{"k": 1}, None, {"k": [2]}, {}],
                                                    dtype=object)},
            "meta_info": {"step": 7}}
    ref = t.put_dataproto(data, namespace="ns", partition="p", stage="rollout")
    ref = t.append_dataproto_fields(ref, {"batch": {"adv": np.ones((4, 2), np.float64)}},
                                    stage="rollout")  # same stage: merged manifest
    ref = t.append_dataproto_fields(ref, {"batch": {"lp": np.zeros(4, np.float32)}},
                                    stage="logprob")
    with pytest.raises(ValueError, match="already exist"):
        t.append_dataproto_fields(ref, {"batch": {"ids": np.zeros(4)}}, stage="x")
    handle = json.loads(json.dumps(export_dataproto_ref(ref)))  # crosses a process as JSON
    got = t.get_dataproto(handle, rows=[3, -4], meta_info_keys=["step"])
    assert np.array_equal(got["batch"]["ids"], data["batch"]["ids"][[3, 0]])
    assert got["non_tensor_batch"]["text"].tolist() == ["d", "a"]
    assert got["non_tensor_batch"]["info"].tolist() == [{}, {"k": 1}]
    assert np.array_equal(got["batch"]["adv"], np.ones((2, 2)))
    assert got["meta_info"] == {"step": 7}
    sub = t.get_dataproto(ref, fields=["score"], rows=slice(1, 3))
    assert np.array_equal(sub["non_tensor_batch"]["score"], np.float32([1, 2]))
    assert sub["batch"] == {}
    with pytest.raises(IndexError):
        t.get_dataproto(ref, rows=[4])
    with pytest.raises(KeyError, match="nope"):
        t.get_dataproto(ref, fields=["nope"])
    assert import_dataproto_ref(handle).field_index == ref.field_index
    t.cleanup_dataproto(handle)
    assert store.objects == {}


def test_adjacent_row_ranges_become_one_read():
    from mooncake._sos_transport import _coalesced
    assert _coalesced([(0, 0, 4), (4, 4, 4), (8, 8, 2), (20, 10, 4), (24, 14, 1)]) == \
        [(0, 0, 10), (20, 10, 5)]
    assert _coalesced([(8, 0, 4), (4, 4, 4)]) == [(8, 0, 4), (4, 4, 4)]  # not in order: kept
    assert _coalesced([]) == []


def test_row_reads_of_a_column_check_its_offsets():
    store, t = transfer()
    ref = t.put_dataproto({"non_tensor_batch": {"s": np.asarray(["ab", "c", "def"],
                                                                   dtype=object)}})
    assert t.get_dataproto(ref, rows=[2, 0])["non_tensor_batch"]["s"].tolist() == ["def", "ab"]
    key = ref.stage_refs["default"].manifest["buffers"]["non_tensor_batch.s.offsets"]["key"]
    store.objects[key] = np.asarray([0, 5, 1, 6], dtype=np.int64).tobytes()  # not monotonic
    with pytest.raises(ValueError, match="offsets"):
        t.get_dataproto(ref, rows=[1])
    with pytest.raises(ValueError, match="offsets"):
        t.get_dataproto(ref)


def test_dataproto_handle_import_rejects_bad_handles():
    _store, t = transfer()
    handle = export_dataproto_ref(t.put_dataproto({"batch": {"x": np.zeros(2)}}))
    for change, match in [({"version": 9}, "version"), ({"kind": "x"}, "kind"),
                          ({"batch_size": -1}, "batch_size"),
                          ({"field_index": {"x": {"stage": "gone", "member": "m",
                                                  "section": "batch"}}}, "unknown stage"),
                          ({"storage_group_id": ""}, "storage_group_id"),
                          ({"global_indexes": [1, "2"]}, "global_indexes")]:
        with pytest.raises(ValueError, match=match):
            import_dataproto_ref({**handle, **change})


def test_field_schemas_force_a_codec_or_say_why_not():
    from mooncake.structured_object_store import FieldSchema
    _store, t = transfer()
    rows = np.empty(3, dtype=object)
    rows[:] = [[1, 2], None, [3]]
    ref = t.put_dataproto({"non_tensor_batch": {"tok": rows}}, field_schemas={
        "tok": FieldSchema("typed_ragged", metadata={"dtype": "int32"})})
    assert ref.encoded_non_tensor["tok"]["metadata"]["dtype"] == "<i4"
    assert t.get_dataproto(ref)["non_tensor_batch"]["tok"].tolist() == [[1, 2], None, [3]]
    bad = np.empty(1, dtype=object)
    bad[0] = 5
    with pytest.raises(TypeError, match="failed to encode.*'text'.*utf8_ragged.*not str"):
        t.put_dataproto({"non_tensor_batch": {"text": bad}},
                        field_schemas={"text": FieldSchema("utf8_ragged")})
    with pytest.raises(ValueError, match="not supported"):
        t.put_dataproto({"non_tensor_batch": {"text": bad}},
                        field_schemas={"text": FieldSchema("ragged_tensor_dict")})
    with pytest.raises(ValueError, match="declares section"):
        t.put_dataproto({"batch": {"x": np.zeros(2)}}, field_schemas={
            "x": FieldSchema("ndarray", metadata={"section": "non_tensor_batch"})})
    with pytest.raises(ValueError, match="not nullable"):
        t.put_dataproto({"non_tensor_batch": {"text": np.asarray(["a", None], dtype=object)}},
                        field_schemas={"text": FieldSchema("auto", nullable=False)})


def test_flat_dict_put_and_get():
    _store, t = transfer()
    flat = {"ids": np.arange(6).reshape(3, 2), "uid": ["a", "b", "c"], "step": 4,
            "tags": ["x", "y"]}
    ref = t.put(flat, type="dict")
    assert set(ref.field_index) == {"ids", "uid"} and ref.meta_info == {"step": 4,
                                                                         "tags": ["x", "y"]}
    back = t.get(ref, type="dict")
    assert back["uid"] == ["a", "b", "c"] and back["step"] == 4
    assert np.array_equal(back["ids"], flat["ids"])
    with pytest.raises(ValueError, match="unsupported"):
        t.put(flat, type="tensor")


class GroupRecordingStore(DictStore):
    """Also batch_put_from (with a BufferPool-like pool below) and pub_tensor, recording the
    group_ids each write was given."""

    def __init__(self):
        super().__init__()
        self.groups = []

    def put(self, key, value, config=None):
        self.groups.append((1, getattr(config, "group_ids", None)))
        return super().put(key, value)


def test_a_storage_group_is_spread_over_every_write_and_kept_by_appends():
    from types import SimpleNamespace
    store, t = transfer(GroupRecordingStore(), default_chunk_bytes=8)
    ref = t.put_dataproto({"batch": {"x": np.arange(8, dtype=np.int64)}},
                          config=SimpleNamespace(group_ids="g1", replica_num=1))
    assert ref._storage_group_id == "g1"
    assert store.groups and all(ids == ["g1"] for _n, ids in store.groups)
    store.groups.clear()
    ref = t.append_dataproto_fields(ref, {"batch": {"y": np.zeros(8)}}, stage="more")
    assert store.groups and all(ids == ["g1"] for _n, ids in store.groups)
    with pytest.raises(ValueError, match="conflicts"):
        t.append_dataproto_fields(ref, {"batch": {"z": np.zeros(8)}}, stage="z",
                                  config=SimpleNamespace(group_ids=["other"]))
    with pytest.raises(ValueError, match="exactly one"):
        t.put_dataproto({"batch": {"x": np.zeros(2)}},
                        config=SimpleNamespace(group_ids=["a", "b"]))
    auto = t.put_dataproto({"batch": {"x": np.zeros(2)}})
    assert auto._storage_group_id.startswith("structured-")
    assert sos._config_for_grouped_keys(SimpleNamespace(group_ids=["g"]), 3).group_ids == \
        ["g", "g", "g"]


# ---- a real master; objects in another process ----

master, holder, store = store_fixtures(lease_ms=500, holder_segment=64 << 20)


@needs_torch
def test_real_store_structured_object_and_dataproto_across_processes(store, holder):
    t = MooncakeBundleTransfer(store, key_prefix="sos", default_chunk_bytes=1 << 16)
    rng = np.random.default_rng(1)
    big = rng.standard_normal((300, 97)).astype(np.float32)       # ~114 KiB: two chunks
    tensor = torch.arange(4 * 33, dtype=torch.float16).reshape(4, 33)
    ref = t.put_structured_object(StructuredObjectPayload({}, {"big": big, "t": tensor,
                                                               "raw": b"\x00\x01" * 1000}))
    got = t.materialize(t.read_spec(ref))
    assert np.array_equal(got.objects["big"], big)
    assert torch.equal(got.objects["t"], tensor) and got.objects["raw"] == b"\x00\x01" * 1000
    part = t.materialize(t.read_spec(ref).select_members(["big"])
                         .slice_member("big", 0, 150, 290, 7)).objects["big"]
    assert np.array_equal(part, big[150:290:7])
    t.release_result(got.objects)

    data = {"batch": {"ids": torch.arange(40, dtype=torch.int64).reshape(8, 5),
                      "mask": np.tri(8, 5, dtype=np.bool_)},
            "non_tensor_batch": {"uid": np.asarray([f"u{i}" for i in range(8)], dtype=object),
                                 "rows": np.asarray([list(range(i)) for i in range(8)],
                                                    dtype=object)},
            "meta_info": {"step": 3}}
    from mooncake.store import ReplicateConfig
    grouped = ReplicateConfig()
    grouped.group_ids = ["dp-group"]  # one logical group over every key the batch writes
    dref = t.put_dataproto(data, stage="rollout", config=grouped)
    assert dref._storage_group_id == "dp-group"
    handle = json.dumps(export_dataproto_ref(dref))
    other = holder.call(
        "import json\n"
        "from mooncake.structured_object_store import MooncakeBundleTransfer\n"
        "t = MooncakeBundleTransfer(store, key_prefix='sos')\n"
        f"r = t.get_dataproto(json.loads({handle!r}), rows=slice(2, 8, 3))\n"
        "result = [r['batch']['ids'].tolist(), r['batch']['mask'].tolist(),\n"
        "          r['non_tensor_batch']['uid'].tolist(), r['non_tensor_batch']['rows'].tolist(),\n"
        "          r['meta_info']]")
    assert other[0] == data["batch"]["ids"][2:8:3].tolist()
    assert other[1] == data["batch"]["mask"][2:8:3].tolist()
    assert other[2] == ["u2", "u5"] and other[3] == [[0, 1], [0, 1, 2, 3, 4]]
    assert other[4] == {"step": 3}
    keys = [ref.manifest_key, dref.stage_refs["rollout"].manifest_key]
    for manifest in (ref.manifest, dref.stage_refs["rollout"].manifest):
        keys += [c["key"] for spec in [manifest["meta"], *manifest["buffers"].values()]
                 for c in spec["chunks"]]
    assert all(store.is_exist(k) == 1 for k in keys)
    t.cleanup_dataproto(dref)
    t.remove_bundle(ref)
    assert [k for k in keys if store.is_exist(k) != 0] == []
