"""Tenants against a real master in strict multi-tenant mode (--enable_multi_tenants, the
quota policy in a YAML file): each client's keys are its tenant's, only tenants in the policy
write, within their quota; the admin API changes and saves the policy; KV events carry the
tenant. The attacks: one tenant naming another's keys through every call a client has."""
import json
import urllib.error
import urllib.request

import pytest

from store_helpers import Master, free_port, new_store, wait_until

MiB = 1 << 20


def http(m, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{m.metrics_port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    policy = tmp_path_factory.mktemp("tenants") / "quotas.yaml"
    policy.write_text("version: 1\ntenants:\n  - name: tenant-a\n    quota: 64MB\n"
                      "  - name: tenant-b\n    quota: 64MB\n  - name: holder\n    quota: 1MB\n")
    m = Master(enable_multi_tenants="true", tenant_quota_connector_type="file",
               tenant_quota_connector_uri=str(policy), default_kv_lease_ttl=100)
    m.policy = policy
    holder = new_store(m, global_segment_size=256 * MiB, tenant_id="holder")
    a = new_store(m, tenant_id="tenant-a")
    b = new_store(m, tenant_id="tenant-b")
    yield m, a, b
    for s in (a, b, holder):
        s.close()
    m.stop()


def test_the_same_key_in_two_tenants_is_two_objects(cluster):
    m, a, b = cluster
    assert a.put("shared", b"from a") == 0
    assert b.get("shared") == b""
    assert b.is_exist("shared") == 0
    assert b.put("shared", b"from b, longer") == 0
    assert a.get("shared") == b"from a"
    assert b.get("shared") == b"from b, longer"
    assert a.get_size("shared") == 6
    assert b.remove("shared", force=True) == 0
    assert a.get("shared") == b"from a"
    assert a.remove("shared", force=True) == 0


def test_no_call_of_one_tenant_reaches_anothers_objects(cluster):
    m, a, b = cluster
    keys = [f"victim-{i}" for i in range(8)]
    for k in keys:
        assert a.put(k, k.encode()) == 0
    forged = ["tenant-a\0victim-0", "\0victim-0", "victim-0"]
    for k in forged:
        assert b.get(k) == b""
        assert b.is_exist(k) == 0
        assert b.remove(k, force=True) != 0
    assert b.batch_is_exist(keys + forged) == [0] * (len(keys) + len(forged))
    assert all(v == b"" for v in b.get_batch(keys))
    assert b.put("own", b"x") == 0
    assert b.remove_by_regex(".*", force=True) == 1
    assert b.remove_by_regex("victim", force=True) == 0
    assert b.remove_by_regex("^tenant-a", force=True) == 0
    assert b.put("own", b"x") == 0
    assert b.remove_all(force=True) == 1
    # An upsert of a's key from b is b's object.
    assert b.upsert("victim-1", b"overwritten?") == 0
    assert a.get("victim-1") == b"victim-1"
    assert b.remove_all(force=True) == 1
    assert [a.get(k) for k in keys] == [k.encode() for k in keys]
    # The admin views: a tenant's keys, as it named them.
    status, body = http(m, "GET", "/get_all_keys?tenant_id=tenant-a")
    assert status == 200 and sorted(body.split()) == sorted(keys)
    assert http(m, "GET", "/get_all_keys?tenant_id=tenant-b") == (200, "")
    assert http(m, "GET", "/get_all_keys")[1] == ""  # the default tenant's (upstream's)
    assert http(m, "GET", "/query_key?key=victim-0&tenant_id=tenant-a")[0] == 200
    assert http(m, "GET", "/query_key?key=victim-0&tenant_id=tenant-b")[0] == 404
    assert a.remove_all(force=True) == len(keys)


def test_unregistered_tenants_cannot_write_and_bad_ids_fail_setup(cluster):
    m, _a, _b = cluster
    c = new_store(m, tenant_id="tenant-c")
    try:
        assert c.put("k", b"v") == -1701  # TENANT_NOT_REGISTERED
        assert c.get("k") == b""
    finally:
        c.close()
    d = new_store(m)  # the default tenant is not special: not in the policy
    try:
        assert d.put("k", b"v") == -1701
    finally:
        d.close()
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, MiB, "tcp", "", m.addr,
                   tenant_id="_admin") == -600


def test_a_quota_is_kept_and_the_admin_api_saves_the_policy(cluster):
    m, _a, _b = cluster
    status, body = http(m, "PUT", "/api/v1/tenant_quotas?tenant_id=small",
                        {"requested_quota_bytes": 2 * MiB})
    assert status == 200, body
    assert json.loads(body)["data"]["effective_quota_bytes"] == 2 * MiB
    assert "small" in m.policy.read_text()  # saved before it took effect
    s = new_store(m, tenant_id="small", local_buffer_size=16 * MiB)
    try:
        blob = b"q" * (600 << 10)
        for i in range(8):  # 4.8 MB through a 2 MiB quota: its oldest objects make room
            assert s.put(f"o{i}", blob) == 0
        snap = json.loads(http(m, "GET", "/api/v1/tenant_quotas?tenant_id=small")[1])["data"]
        assert 0 < snap["charged_bytes"] <= 2 * MiB and not snap["over_quota"]
        assert s.get("o7") == blob
        assert s.is_exist("o0") == 0
        assert s.put("huge", b"h" * (3 * MiB)) == -1700  # TENANT_QUOTA_EXCEEDED
        status, body = http(m, "DELETE", "/api/v1/tenant_quotas?tenant_id=small")
        assert status == 409 and json.loads(body)["error_code"] == -1702
        assert s.remove_all(force=True) > 0
        status, body = http(m, "DELETE", "/api/v1/tenant_quotas?tenant_id=small")
        assert status == 200, body
        assert "small" not in m.policy.read_text()
        assert s.put("again", b"x") == -1701
    finally:
        s.close()
    listing = json.loads(http(m, "GET", "/api/v1/tenant_quotas")[1])["data"]
    assert {t["tenant_id"] for t in listing} >= {"tenant-a", "tenant-b", "holder"}
    assert http(m, "PUT", "/api/v1/tenant_quotas?tenant_id=x", {"requested_quota_bytes": 0})[0] == 400
    text = m.metrics_text()
    assert 'mooncake_tenant_quota_requested_bytes{tenant_id="tenant-a"} 67108864' in text
    assert 'mooncake_tenant_evict_bytes_total{tenant_id="small"}' in text


def test_a_master_with_a_missing_policy_file_does_not_start(tmp_path):
    with pytest.raises(AssertionError) as e:
        Master(enable_multi_tenants="true",
               tenant_quota_connector_uri=str(tmp_path / "missing.yaml")).stop()
    assert "missing.yaml" in str(e.value)


def test_without_strict_mode_tenants_share_one_key_space():
    with Master() as m:
        a = new_store(m, global_segment_size=16 * MiB, tenant_id="tenant-a")
        b = new_store(m, tenant_id="tenant-b")
        try:
            assert a.put("k", b"v") == 0
            assert b.get("k") == b"v"
            assert http(m, "GET", "/api/v1/tenant_quotas")[0] == 409
        finally:
            a.close()
            b.close()


def test_kv_events_carry_the_tenant(tmp_path):
    zmq = pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from test_kv_events import Subscriber
    policy = tmp_path / "q.yaml"
    policy.write_text("version: 1\ntenants:\n  - name: t1\n    quota: 32MB\n")
    pub = free_port()
    with Master(enable_multi_tenants="true", tenant_quota_connector_uri=str(policy),
                enable_kv_events="true", kv_events_bind_endpoint=f"tcp://127.0.0.1:{pub}",
                kv_events_backend_id="pool") as m:
        s = new_store(m, global_segment_size=32 * MiB, tenant_id="t1")
        sub = Subscriber(f"tcp://127.0.0.1:{pub}")
        try:
            n = [0]

            def seen():  # a SUB socket joins asynchronously: put until one is seen
                n[0] += 1
                assert s.put(hex(n[0]), b"v") == 0
                sub.pump(100)
                return sub.events()
            e = wait_until(seen, 15, what="an event of the puts")[0]
            assert e["tenant_id"] == "t1" and e["event_type"] == "stored"
            assert e["seq_hashes"] == [int(e["object_key"], 16)]
        finally:
            sub.close()
            s.close()
    del zmq
