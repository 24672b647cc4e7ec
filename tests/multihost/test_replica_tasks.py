"""Replica tasks across hosts (each host its own network and pid namespace, bytes over TCP
across the bridge): objects on one holder are copied to a second host's segment by the
first holder's engine (create_copy_task), and survive kill -9 of the first host byte-exact;
a move leaves them on the target only; tasks whose executor is frozen and then killed end
FAILED once its TTL passes (never SUCCESS), and leave no replica of other bytes."""
import json
import time

from mhcluster import Cluster

MiB = 1 << 20
AGENT = __import__("pathlib").Path(__file__).with_name("store_agent.py")
COUNT, SIZE = 12, 1 * MiB
SUCCESS, FAILED = 3, 2


def agent(host, master, segment):
    a = host.run([host.cluster.venv_python, AGENT], pipe=True)
    assert a.readline(30) == '{"ready": true}'
    rc = a.request({"op": "setup", "host": host.ip, "master": master.addr, "segment": segment,
                    "buffer": 16 * MiB}, timeout=60)
    assert rc == {"rc": 0}, (rc, a.log_tail())
    a.name = a.request({"op": "hostname"})["name"]
    return a


def wait_tasks(user, ids, timeout=60):
    deadline = time.time() + timeout
    out = {}
    while True:
        for key, task_id in ids.items():
            if key in out:
                continue
            q = user.request({"op": "query", "id": task_id})
            assert q["rc"] == 0, q
            if q["status"] in (SUCCESS, FAILED):
                out[key] = q
        if len(out) == len(ids) or time.time() > deadline:
            return out
        time.sleep(0.2)


def holders(host, key):
    status, body = host.http_get(9003, f"/query_key?key={key}")
    if status != 200:
        return set()
    return {d["transport_endpoint_"] for d in json.loads(body)["data"]}


def test_replica_tasks_across_hosts(tmp_path):
    with Cluster(5, workdir=tmp_path) as c:
        master = c.start_master(c.hosts[0], "--client_ttl=3")
        h1, h2, h3 = (agent(c.hosts[i], master, 64 * MiB) for i in (1, 2, 3))
        user = agent(c.hosts[4], master, 0)
        w = user.request({"op": "put_random", "prefix": "k-", "count": COUNT, "size": SIZE,
                          "preferred": h1.name}, timeout=120)
        assert w["rcs"] == [0] * COUNT
        keys = sorted(w["sha"])
        assert all(holders(c.hosts[0], k) == {h1.name} for k in keys)

        # Copies to h2, run by h1's engine.
        ids = {}
        for k in keys:
            r = user.request({"op": "copy", "key": k, "targets": [h2.name]})
            assert r["rc"] == 0, r
            ids[k] = r["id"]
        done = wait_tasks(user, ids)
        assert {k: q["status"] for k, q in done.items()} == {k: SUCCESS for k in keys}, done
        assert all(holders(c.hosts[0], k) == {h1.name, h2.name} for k in keys)
        # kill -9 of the source host: every object reads byte-exact from the copy.
        h1.kill()
        h1.wait(10)
        time.sleep(4)  # past the TTL: the master drops h1's segment
        r = user.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)
        assert r["sha"] == w["sha"], r["rc"]
        assert all(holders(c.hosts[0], k) == {h2.name} for k in keys)

        # A move from h2 to h3: the objects end on h3 only, byte-exact.
        ids = {}
        for k in keys[:4]:
            r = user.request({"op": "move", "key": k, "source": h2.name, "target": h3.name})
            assert r["rc"] == 0, r
            ids[k] = r["id"]
        done = wait_tasks(user, ids)
        assert all(q["status"] == SUCCESS for q in done.values()), done
        assert all(holders(c.hosts[0], k) == {h3.name} for k in keys[:4])
        r = user.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)
        assert r["sha"] == w["sha"], r["rc"]

        # An executor frozen before it fetches its tasks, then killed: the tasks end FAILED
        # once its TTL passes, no object gains a replica on h3, and its objects are gone.
        frozen = keys[4:]
        h2.stop()
        ids = {}
        for k in frozen:
            r = user.request({"op": "copy", "key": k, "targets": [h3.name]})
            assert r["rc"] == 0, r
            ids[k] = r["id"]
        h2.kill()
        h2.wait(10)
        done = wait_tasks(user, ids, timeout=30)
        assert {k: q["status"] for k, q in done.items()} == {k: FAILED for k in frozen}, done
        assert all("heartbeat" in q["message"] or "no longer holds" in q["message"]
                   for q in done.values()), done
        r = user.request({"op": "get", "keys": frozen, "size": SIZE}, timeout=120)
        assert set(r["rc"].values()) == {-704}, r["rc"]
        r = user.request({"op": "get", "keys": keys[:4], "size": SIZE}, timeout=120)
        assert r["sha"] == {k: w["sha"][k] for k in keys[:4]}, r["rc"]
