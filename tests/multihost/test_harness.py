"""First multi-host scenarios on the harness (mhcluster.py): etcd leader failover across hosts,
and today's (non-HA) Store with its master, a segment holder, a writer and a reader each on its
own host, then the holder killed."""
import pathlib
import time

from mhcluster import Cluster

AGENT = pathlib.Path(__file__).with_name("store_agent.py")
KiB, MiB = 1 << 10, 1 << 20

# Bounds this file asserts.
ETCD_ELECTION_BOUND_S = 10.0   # a new etcd leader after its leader stops or dies (1 s timeout)
ETCD_PUT_BOUND_S = 10.0        # a put + get through every endpoint works again
GET_AFTER_DEATH_BOUND_S = 5.0  # one get of an object whose only replica's host died fails by then
SEGMENT_DROP_BOUND_S = 15.0    # the master drops a dead client's segment (--client_ttl=2)


def etcd_put_get(etcd, host, key, value, bound=ETCD_PUT_BOUND_S):
    """Puts key=value through every endpoint with etcdctl on `host`, retrying failed attempts
    (one may go to a stopped member and time out) until `bound`; then reads it back. Returns
    the attempts the put took."""
    deadline = time.monotonic() + bound
    attempts = 0
    while True:
        attempts += 1
        r = etcd.etcdctl(host, "put", key, value, command_timeout=2)
        if r.returncode == 0 and r.stdout.strip() == "OK":
            break
        assert time.monotonic() < deadline, f"put {key} kept failing: {r.stderr[-1000:]}"
    while True:
        r = etcd.etcdctl(host, "get", key, "--print-value-only", command_timeout=2)
        if r.returncode == 0:
            assert r.stdout.strip() == value, r.stdout
            return attempts
        assert time.monotonic() < deadline, f"get {key} kept failing: {r.stderr[-1000:]}"


def test_etcd_leader_failover_across_hosts(tmp_path):
    with Cluster(4, workdir=tmp_path) as c:
        e = c.etcd(hosts=c.hosts[:3])
        client = c.hosts[3]
        first = e.leader()
        assert first is not None
        assert etcd_put_get(e, client, "before", "v0") == 1

        # SIGSTOP of the leader: the other two elect one of them.
        e.member(first).stop()
        t0 = time.monotonic()
        others = [i for i in range(3) if i != first]
        second = e.wait_leader(ETCD_ELECTION_BOUND_S, among=others)
        print(f"etcd: m{first} stopped, m{second} leads after {time.monotonic() - t0:.2f} s")
        etcd_put_get(e, client, "while-stopped", "v1")
        assert e.status(first, timeout=0.5) is None  # the stopped member does not answer

        # SIGCONT: it comes back as a follower of the new leader and has the write it missed.
        e.member(first).cont()
        deadline = time.monotonic() + ETCD_ELECTION_BOUND_S
        while True:
            st = e.statuses()
            lead_id = st[second]["header"]["member_id"] if st[second] else None
            if st[first] and lead_id and st[first]["leader"] == lead_id:
                break
            assert time.monotonic() < deadline, f"m{first} did not rejoin: {st}"
            time.sleep(0.1)
        assert e.leader() == second
        r = e.etcdctl(client, "get", "while-stopped", "--print-value-only",
                      endpoints=f"http://{c.hosts[first].ip}:2379")
        assert r.returncode == 0 and r.stdout.strip() == "v1", r.stderr

        # kill -9 of the leader: the remaining two elect one of them.
        e.member(second).kill()
        assert e.member(second).wait(5) == 137
        t0 = time.monotonic()
        rest = [i for i in range(3) if i != second]
        third = e.wait_leader(ETCD_ELECTION_BOUND_S, among=rest)
        print(f"etcd: m{second} killed, m{third} leads after {time.monotonic() - t0:.2f} s")
        etcd_put_get(e, client, "after-kill", "v2")
        r = e.etcdctl(client, "get", "", "--from-key", "--keys-only")
        assert sorted(r.stdout.split()) == ["after-kill", "before", "while-stopped"]


def start_agent(host, master, segment, buffer=16 * MiB):
    """A store_agent.py on `host`, set up against `master` lending `segment` bytes."""
    a = host.run([host.cluster.venv_python, AGENT], pipe=True)
    assert a.readline(30) == '{"ready": true}'
    assert a.request({"op": "setup", "host": host.ip, "master": master.addr, "segment": segment,
                      "buffer": buffer}, timeout=30) == {"rc": 0}
    return a


def segments(master_host):
    status, body = master_host.http_get(9003, "/get_all_segments")
    assert status == 200, body
    return body


def test_store_across_hosts_and_a_dead_holder(tmp_path):
    with Cluster(4, workdir=tmp_path) as c:
        h0, h1, h2, h3 = c.hosts
        master = c.start_master(h0, "--client_ttl=2")
        holder = start_agent(h1, master, segment=64 * MiB)
        writer = start_agent(h2, master, segment=0)
        reader = start_agent(h3, master, segment=0)
        assert h1.ip in segments(h0)

        rx0, tx0 = h1.net_bytes()
        w = writer.request({"op": "put_random", "prefix": "obj-", "count": 200, "size": 64 * KiB},
                           timeout=60)
        assert w["rcs"] == [0] * 200
        keys = sorted(w["sha"])
        r = reader.request({"op": "get", "keys": keys, "size": 64 * KiB}, timeout=60)
        assert r["rc"] == {k: 64 * KiB for k in keys}
        assert r["sha"] == w["sha"]  # 200 objects, byte-exact
        rx1, tx1 = h1.net_bytes()
        # The bytes crossed host 1's link both ways (written into it, read out of it).
        assert rx1 - rx0 >= 200 * 64 * KiB and tx1 - tx0 >= 200 * 64 * KiB, (rx1 - rx0, tx1 - tx0)
        print(f"store: put 200 x 64 KiB in {w['seconds']:.2f} s, got them in {r['seconds']:.2f} s;"
              f" host 1 rx {rx1 - rx0} tx {tx1 - tx0} bytes")

        # kill -9 of the holder: every get fails with a code, each within the bound.
        holder.kill()
        assert holder.wait(5) == 137
        r = reader.request({"op": "get", "keys": keys, "size": 64 * KiB},
                           timeout=GET_AFTER_DEATH_BOUND_S * len(keys))
        codes = sorted(set(r["rc"].values()))
        print(f"store: after the kill, 200 gets in {r['seconds']:.2f} s (slowest "
              f"{r['max_seconds']:.3f} s), codes {codes}")
        assert all(v < 0 for v in r["rc"].values()), codes
        assert r["sha"] == {}
        assert r["max_seconds"] < GET_AFTER_DEATH_BOUND_S

        # The master drops the dead client's segment; its objects are gone (-704).
        deadline = time.monotonic() + SEGMENT_DROP_BOUND_S
        while h1.ip in segments(h0):
            assert time.monotonic() < deadline, segments(h0)
            time.sleep(0.2)
        r = reader.request({"op": "get", "keys": keys[:20], "size": 64 * KiB}, timeout=30)
        assert set(r["rc"].values()) == {-704}, r["rc"]

        # Host 2 lends a segment: hosts 2 and 3 put and get among themselves.
        lender = start_agent(h2, master, segment=64 * MiB)
        p3 = reader.request({"op": "put_random", "prefix": "h3-", "count": 50, "size": 64 * KiB},
                            timeout=60)
        assert p3["rcs"] == [0] * 50
        p2 = lender.request({"op": "put_random", "prefix": "h2-", "count": 50, "size": 64 * KiB},
                            timeout=60)
        assert p2["rcs"] == [0] * 50
        for who, written in ((lender, p3), (reader, p2), (writer, p3), (reader, p3)):
            g = who.request({"op": "get", "keys": sorted(written["sha"]), "size": 64 * KiB},
                            timeout=60)
            assert set(g["rc"].values()) == {64 * KiB}
            assert g["sha"] == written["sha"]
        assert master.alive() and writer.alive() and reader.alive() and lender.alive()
