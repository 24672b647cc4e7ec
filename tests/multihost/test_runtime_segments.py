"""Run-time segments across hosts (each host its own network and pid namespace, bytes over
TCP across the bridge): memory two holders lend after setup (allocate_and_mount_segment)
takes a user's objects with two replicas; a holder stopped (SIGSTOP) and resumed within the
TTL loses nothing, every get meanwhile ends within a bound; a holder killed with -9 leaves
every acknowledged put readable, byte-exact, from the other one's segment; unmounting the
survivor's segment takes the objects with it and gets fail cleanly."""
import time

from mhcluster import Cluster

MiB, KiB = 1 << 20, 1 << 10
AGENT = __import__("pathlib").Path(__file__).with_name("store_agent.py")
COUNT, SIZE = 40, 64 * KiB
# A get whose first replica is on a silent (stopped) holder waits out the client's transfer
# timeout (30 s, StoreClientOptions.transfer_timeout), then reads the next replica; the
# engine then knows the peer is silent and later gets do not wait again.
GET_BOUND_S = 35


def agent(host, master):
    a = host.run([host.cluster.venv_python, AGENT], pipe=True)
    assert a.readline(30) == '{"ready": true}'
    rc = a.request({"op": "setup", "host": host.ip, "master": master.addr, "segment": 0,
                    "buffer": 16 * MiB}, timeout=60)
    assert rc == {"rc": 0}, (rc, a.log_tail())
    return a


def test_runtime_segments_across_hosts(tmp_path):
    with Cluster(4, workdir=tmp_path) as c:
        master = c.start_master(c.hosts[0], "--client_ttl=3")
        h1, h2, user = (agent(c.hosts[i], master) for i in (1, 2, 3))
        # Nobody lends memory yet.
        assert user.request({"op": "put_random", "prefix": "none-", "count": 1,
                             "size": SIZE}, timeout=60)["rcs"][0] != 0
        ids = {}
        for name, h in (("h1", h1), ("h2", h2)):
            r = h.request({"op": "allocate", "size": 32 * MiB}, timeout=60)
            assert r["ret"] == 0 and r["allocated_size"] == 32 * MiB, r
            ids[name] = r["segment_ids"]
        w = user.request({"op": "put_random", "prefix": "k-", "count": COUNT, "size": SIZE,
                          "replicas": 2}, timeout=120)
        assert w["rcs"] == [0] * COUNT
        keys = sorted(w["sha"])

        def read_all():
            return user.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)

        r = read_all()
        assert r["sha"] == w["sha"]  # read through the other hosts
        # A holder frozen for less than the TTL: gets go on (from the other replica or after
        # the stall), each within a bound; after it resumes, everything is byte-exact.
        h1.stop()
        r = read_all()
        h1.cont()
        assert r["max_seconds"] < GET_BOUND_S, r["max_seconds"]
        assert r["seconds"] < GET_BOUND_S + 10, r["seconds"]  # one stall, not one per key
        assert all(r["sha"].get(k) in (None, w["sha"][k]) for k in keys)  # never other bytes
        r = read_all()
        assert r["sha"] == w["sha"], r["rc"]
        # kill -9 of a holder: every acknowledged put still reads, from the other replica.
        h1.kill()
        h1.wait(10)
        r = read_all()
        assert r["sha"] == w["sha"], r["rc"]
        assert r["max_seconds"] < GET_BOUND_S
        time.sleep(4)  # past the TTL: the master drops the dead holder's segment
        r = read_all()
        assert r["sha"] == w["sha"], r["rc"]
        # The survivor takes its segment back: its objects go with it, gets fail cleanly.
        assert h2.request({"op": "unmount_free", "ids": ids["h2"]}, timeout=60) == {"rc": 0}
        r = read_all()
        assert set(r["rc"].values()) == {-704}, r["rc"]
        assert r["max_seconds"] < GET_BOUND_S
