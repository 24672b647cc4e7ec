"""Tenants on an HA cluster across hosts (strict mode, the quota policy in etcd): three masters
and a three-member etcd on hosts 0-2, clients of two tenants on hosts 3 and 4 following the
leader through etcd://. The same keys in both tenants stay two sets of objects through a
kill -9 of the leader (the operation log carries the scoped keys); the new leader loads the
policy from etcd, rebuilds each tenant's charge from its objects, and takes policy changes."""
import json
import time

from mhcluster import Cluster
from test_master_ha import CLUSTER_ID, FAILOVER_BOUND_S, health, ha_flags, wait_one_leader

KiB, MiB = 1 << 10, 1 << 20
AGENT = __import__("pathlib").Path(__file__).with_name("store_agent.py")
POLICY_KEY = f"mooncake-store/{CLUSTER_ID}/tenant_quota_policy"
SIZE = 64 * KiB


def agent(host, e, segment, tenant):
    a = host.run([host.cluster.venv_python, AGENT], pipe=True,
                 env={"MC_STORE_CLUSTER_ID": CLUSTER_ID})
    assert a.readline(30) == '{"ready": true}'
    rc = a.request({"op": "setup", "host": host.ip, "master": "etcd://" + e.endpoints,
                    "segment": segment, "buffer": 16 * MiB, "tenant": tenant}, timeout=60)
    assert rc == {"rc": 0}, (rc, a.log_tail())
    return a


def quotas(host):
    status, body = host.http_get(9003, "/api/v1/tenant_quotas")
    assert status == 200, body
    return {t["tenant_id"]: t for t in json.loads(body)["data"]}


def put_quota(host, leader, tenant, n):
    code = ("import json, urllib.request, urllib.error\n"
            f"r = urllib.request.Request('http://{leader.ip}:9003/api/v1/tenant_quotas?tenant_id={tenant}',"
            f" method='PUT', data=json.dumps({{'requested_quota_bytes': {n}}}).encode())\n"
            "try:\n"
            "    print(json.dumps([urllib.request.urlopen(r, timeout=5).status]))\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(json.dumps([e.code, e.read().decode()]))\n")
    return host.python_json(code)


def test_tenants_survive_a_leader_killed(tmp_path):
    with Cluster(5, workdir=tmp_path) as c:
        e = c.etcd(c.hosts[:3])
        policy = ("version: 1\ntenants:\n  - name: t-a\n    quota: 512MB\n"
                  "  - name: t-b\n    quota: 512MB\n")
        assert e.etcdctl(c.hosts[0], "put", POLICY_KEY, policy).returncode == 0
        flags = ha_flags(e) + ["--enable_multi_tenants=true", "--tenant_quota_connector_type=etcd",
                               f"--tenant_quota_connector_uri={e.endpoints}"]
        masters = {h.index: c.start_master(h, *flags) for h in c.hosts[:3]}
        leader = wait_one_leader(c.hosts[:3], 15)
        a_writer = agent(c.hosts[3], e, 256 * MiB, "t-a")
        b_writer = agent(c.hosts[4], e, 0, "t-b")
        a_reader = agent(c.hosts[4], e, 0, "t-a")
        wa = a_writer.request({"op": "put_random", "prefix": "k-", "count": 40, "size": SIZE},
                              timeout=120)
        assert wa["rcs"] == [0] * 40
        keys = sorted(wa["sha"])
        miss = b_writer.request({"op": "get", "keys": keys, "size": SIZE}, timeout=60)
        assert all(rc < 0 for rc in miss["rc"].values()), "t-b reads t-a's objects"
        wb = b_writer.request({"op": "put_random", "prefix": "k-", "count": 40, "size": SIZE},
                              timeout=120)
        assert wb["rcs"] == [0] * 40  # the same keys: t-b's own objects
        before = quotas(leader)
        assert before["t-a"]["charged_bytes"] == 40 * SIZE
        assert before["t-b"]["charged_bytes"] == 40 * SIZE

        masters[leader.index].kill()
        others = [h for h in c.hosts[:3] if h is not leader]
        t0 = time.monotonic()
        new = wait_one_leader(others, FAILOVER_BOUND_S)
        failover = time.monotonic() - t0
        after = quotas(new)
        assert after["t-a"]["charged_bytes"] == 40 * SIZE, after
        assert after["t-b"]["charged_bytes"] == 40 * SIZE, after
        ra = a_reader.request({"op": "get", "keys": keys, "size": SIZE}, timeout=120)
        rb = b_writer.request({"op": "get", "keys": keys, "size": SIZE}, timeout=120)
        assert ra["sha"] == wa["sha"], "t-a's objects changed across the failover"
        assert rb["sha"] == wb["sha"], "t-b's objects changed across the failover"
        assert all(ra["sha"][k] != rb["sha"][k] for k in keys)
        # The new leader takes policy changes and saves them to etcd.
        assert put_quota(c.hosts[3], new, "t-c", 1 << 20) == [200]
        got = e.etcdctl(c.hosts[0], "get", POLICY_KEY, "--print-value-only")
        assert got.returncode == 0 and "t-c" in got.stdout
        assert "t-c" in quotas(new)
        assert health(new)["role"] == "leader"
        print(f"tenants: kill -9 of the leader {leader.ip}: {new.ip} serves after "
              f"{failover:.2f} s with both tenants' 40 objects each byte-exact and their charges "
              f"({40 * SIZE} bytes each) rebuilt")
