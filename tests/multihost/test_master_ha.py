"""Master HA on etcd across hosts (issue 29; src/store/ha/README.md): three masters and a
three-member etcd on hosts 0-2, a Store client lending memory on host 3 (it writes), a reader
on host 4, both following the leader through etcd://. Each scenario checks that no
acknowledged put is lost, byte for byte, and prints what it measured."""
import json
import signal
import time

import pytest

from mhcluster import Cluster

KiB, MiB = 1 << 10, 1 << 20
AGENT = __import__("pathlib").Path(__file__).with_name("store_agent.py")
CLUSTER_ID = "mh_ha"
LEASE_S = 3
# A leader lost: its lease lapses (LEASE_S), a standby sees master_view gone (200 ms poll),
# campaigns, reads the log's tail and promotes; clients poll the view every 200 ms.
FAILOVER_BOUND_S = LEASE_S + 5


def ha_flags(e):
    return ["--enable_ha=true", f"--ha_backend_connstring={e.endpoints}", "--enable_oplog=true",
            f"--cluster_id={CLUSTER_ID}", f"--ha_lease_ttl_sec={LEASE_S}",
            "--oplog_poll_interval_ms=200", "--client_ttl=30"]


def health(host):
    status, body = host.http_get(9003, "/health", timeout=2)
    return json.loads(body) if status == 200 else None


def serving(hosts):
    return [h for h in hosts if (health(h) or {}).get("service_ready")]


def wait_one_leader(hosts, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = serving(hosts)
        if len(s) == 1:
            return s[0]
        assert time.monotonic() < deadline, f"{len(s)} masters serve among {hosts}"
        time.sleep(0.05)


def agent(host, e, segment):
    a = host.run([host.cluster.venv_python, AGENT], pipe=True,
                 env={"MC_STORE_CLUSTER_ID": CLUSTER_ID})
    assert a.readline(30) == '{"ready": true}'
    rc = a.request({"op": "setup", "host": host.ip, "master": "etcd://" + e.endpoints,
                    "segment": segment, "buffer": 16 * MiB}, timeout=60)
    assert rc == {"rc": 0}, (rc, a.log_tail())
    return a


def put(a, prefix, count, size=64 * KiB, timeout=120):
    return a.request({"op": "put_random", "prefix": prefix, "count": count, "size": size},
                     timeout=timeout)


def acked(w):
    return {k: v for (k, v), rc in zip(w["sha"].items(), w["rcs"]) if rc == 0}


def check_all(reader, want, size=64 * KiB):
    r = reader.request({"op": "get", "keys": sorted(want), "size": size}, timeout=120)
    lost = [k for k in want if r["rc"].get(k) != size or r["sha"].get(k) != want[k]]
    assert not lost, f"{len(lost)} acknowledged objects lost or wrong, e.g. " \
                     f"{[(k, r['rc'].get(k)) for k in lost[:5]]}"
    return r


def setup(c):
    e = c.etcd(c.hosts[:3])
    masters = {h.index: c.start_master(h, *ha_flags(e)) for h in c.hosts[:3]}
    leader = wait_one_leader(c.hosts[:3], 15)
    writer = agent(c.hosts[3], e, 256 * MiB)
    reader = agent(c.hosts[4], e, 0)
    return e, masters, leader, writer, reader


# kill -9, and a clean stop (SIGTERM: the leader steps down, failing the replies it holds; a
# PutStart it answered kNotLeader may still be in the log, and its resend must not be
# acknowledged without being written: the put nonce).
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_the_leader_killed_under_load_loses_no_acknowledged_put(tmp_path, sig):
    with Cluster(5, workdir=tmp_path) as c:
        e, masters, leader, writer, reader = setup(c)
        others = [h for h in c.hosts[:3] if h is not leader]
        assert [health(h)["role"] for h in others] == ["standby", "standby"]
        w1 = put(writer, "a-", 100)
        assert w1["rcs"] == [0] * 100
        want = acked(w1)
        # Puts in flight while the leader dies.
        writer.send(json.dumps({"op": "put_random", "prefix": "b-", "count": 300,
                                "size": 64 * KiB}))
        time.sleep(0.5)
        masters[leader.index].kill(sig)
        t0 = time.monotonic()
        new = wait_one_leader(others, FAILOVER_BOUND_S)
        failover = time.monotonic() - t0
        w2 = json.loads(writer.readline(180))
        want.update(acked(w2))
        failed = len(w2["rcs"]) - len(acked(w2))
        r = check_all(reader, want)
        print(f"ha: {signal.Signals(sig).name} of the leader {leader.ip} under puts: {new.ip} serves after "
              f"{failover:.2f} s; of 300 puts in flight {300 - failed} acknowledged, {failed} "
              f"failed (codes {sorted(set(w2['rcs']) - {0})}); all {len(want)} acknowledged "
              f"objects read back byte-exact in {r['seconds']:.2f} s")
        assert failover < FAILOVER_BOUND_S
        assert len(acked(w2)) > 0, "no put was acknowledged after the failover"
        # The survivors agree; the new leader takes puts.
        assert [h for h in others if health(h)["role"] == "leader"] == [new]
        assert put(writer, "c-", 20)["rcs"] == [0] * 20


def test_a_leader_stopped_past_its_lease_steps_down_when_resumed(tmp_path):
    with Cluster(5, workdir=tmp_path) as c:
        e, masters, leader, writer, reader = setup(c)
        w = put(writer, "a-", 50)
        want = acked(w)
        assert len(want) == 50
        others = [h for h in c.hosts[:3] if h is not leader]
        old = masters[leader.index]
        old.stop()
        t0 = time.monotonic()
        new = wait_one_leader(others, FAILOVER_BOUND_S)
        took = time.monotonic() - t0
        # Clients read master_view every 200 ms: a put sent before this one's next read goes
        # to the stopped master, and a PutStart that timed out there may have acted, so it
        # fails (-900) rather than being sent again. After a poll every put goes to the new one.
        time.sleep(0.6)
        w = put(writer, "b-", 50)
        assert w["rcs"] == [0] * 50, sorted(set(w["rcs"]))
        want.update(acked(w))
        old.cont()
        # Resumed past its deadline, it serves nothing and becomes a standby of the new view.
        deadline = time.monotonic() + 5
        while (health(leader) or {}).get("role") != "standby":
            assert time.monotonic() < deadline, health(leader)
            time.sleep(0.05)
        assert not health(leader)["service_ready"]
        assert serving(c.hosts[:3]) == [new]
        w = put(writer, "c-", 20)
        assert w["rcs"] == [0] * 20
        want.update(acked(w))
        check_all(reader, want)
        print(f"ha: leader SIGSTOPped: {new.ip} serves after {took:.2f} s; the old one, "
              f"resumed, is a standby; {len(want)} objects read back")


def test_every_master_restarted_keeps_every_object(tmp_path):
    with Cluster(5, workdir=tmp_path) as c:
        e, masters, leader, writer, reader = setup(c)
        w = put(writer, "a-", 200)
        want = acked(w)
        assert len(want) == 200
        for m in masters.values():
            m.kill()
        for m in masters.values():
            m.wait(5)
        t0 = time.monotonic()
        masters = {h.index: c.start_master(h, *ha_flags(e)) for h in c.hosts[:3]}
        new = wait_one_leader(c.hosts[:3], 15 + LEASE_S)
        took = time.monotonic() - t0
        r = check_all(reader, want)
        print(f"ha: all three masters killed and restarted: {new.ip} serves after {took:.2f} s; "
              f"{len(want)} objects read back in {r['seconds']:.2f} s")
        assert put(writer, "b-", 20)["rcs"] == [0] * 20


def test_the_etcd_leader_stopped_and_killed_under_puts(tmp_path):
    with Cluster(5, workdir=tmp_path) as c:
        e, masters, leader, writer, reader = setup(c)
        want = acked(put(writer, "a-", 50))
        assert len(want) == 50
        i = e.wait_leader()
        e.member(i).stop()  # SIGSTOP: its connections stay open, nothing answers
        t0 = time.monotonic()
        w = put(writer, "b-", 100, timeout=180)
        stopped = time.monotonic() - t0
        want.update(acked(w))
        e.wait_leader(among=[k for k in range(3) if k != i])
        # Once etcd has a leader again, every put succeeds.
        w2 = put(writer, "c-", 50)
        assert w2["rcs"] == [0] * 50, sorted(set(w2["rcs"]))
        want.update(acked(w2))
        e.member(i).cont()
        j = e.wait_leader()
        e.member(j).kill()
        t1 = time.monotonic()
        w3 = put(writer, "d-", 100, timeout=180)
        killed = time.monotonic() - t1
        want.update(acked(w3))
        e.wait_leader(among=[k for k in range(3) if k != j])
        new = wait_one_leader(c.hosts[:3], FAILOVER_BOUND_S)
        check_all(reader, want)
        assert put(writer, "e-", 20)["rcs"] == [0] * 20
        print(f"ha: etcd leader m{i} SIGSTOPped: {len(acked(w))} of 100 puts acknowledged in "
              f"{stopped:.2f} s (codes {sorted(set(w['rcs']))}); etcd leader m{j} killed: "
              f"{len(acked(w3))} of 100 in {killed:.2f} s; master {new.ip} serves "
              f"(was {leader.ip}); all {len(want)} acknowledged objects read back")


def test_a_client_given_a_standbys_address_fails_at_once(tmp_path):
    """A client given a standby's host:port (not etcd://) gets -1010 at setup, at once, and
    its log names the leader; given the leader's, it works."""
    with Cluster(4, workdir=tmp_path) as c:
        e = c.etcd(c.hosts[:3])
        masters = {h.index: c.start_master(h, *ha_flags(e)) for h in c.hosts[:2]}
        leader = wait_one_leader(c.hosts[:2], 15)
        standby = next(h for h in c.hosts[:2] if h is not leader)
        time.sleep(0.5)  # the standby has read master_view
        a = c.hosts[3].run([c.venv_python, AGENT], pipe=True)
        assert a.readline(30) == '{"ready": true}'
        t0 = time.monotonic()
        rc = a.request({"op": "setup", "host": c.hosts[3].ip,
                        "master": masters[standby.index].addr, "segment": 16 * MiB,
                        "buffer": 4 * MiB}, timeout=30)
        took = time.monotonic() - t0
        assert rc == {"rc": -1010}, (rc, a.log_tail())
        assert took < 5, took
        assert masters[leader.index].addr in a.log_tail(), a.log_tail()
        print(f"ha: a client given the standby {standby.ip}'s address failed setup with -1010 "
              f"in {took * 1000:.0f} ms, naming the leader {leader.ip}")
        ok = a.request({"op": "setup", "host": c.hosts[3].ip,
                        "master": masters[leader.index].addr, "segment": 16 * MiB,
                        "buffer": 4 * MiB}, timeout=30)
        assert ok == {"rc": 0}, (ok, a.log_tail())
