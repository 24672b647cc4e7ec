"""The disk tier across hosts (each host its own network and pid namespace, bytes over TCP
across the bridge): a holder on one host lends 16 MiB of DRAM and offloads to its own
directory; a writer on another host puts four times that; a reader on a third host reads every
object byte-exact, most from the holder's disk through its offload service; SIGSTOP of the
holder past its TTL: gets fail within a bound, and once it runs again every object reads
byte-exact; kill -9 of the
holder: gets fail cleanly (no hang, no bytes) and the keys are gone after its TTL; the holder
restarted on the same directory registers its objects again and they read byte-exact."""
import re
import time

from mhcluster import Cluster

MiB = 1 << 20
AGENT = __import__("pathlib").Path(__file__).with_name("store_agent.py")
SEG, SIZE = 16 * MiB, 1 * MiB
COUNT = 4 * SEG // SIZE


def agent(host, master, segment, offload=""):
    a = host.run([host.cluster.venv_python, AGENT], pipe=True)
    assert a.readline(30) == '{"ready": true}'
    rc = a.request({"op": "setup", "host": host.ip, "master": master.addr, "segment": segment,
                    "buffer": 16 * MiB, "offload": offload}, timeout=60)
    assert rc == {"rc": 0}, (rc, a.log_tail())
    return a


def metric(host, name):
    status, body = host.http_get(9003, "/metrics")
    assert status == 200
    m = re.search(rf"^{re.escape(name)} (\d+)", body, re.M)
    return int(m.group(1)) if m else 0


def test_disk_tier_across_hosts(tmp_path):
    disk = tmp_path / "holder-disk"
    disk.mkdir()
    with Cluster(4, workdir=tmp_path / "cluster") as c:
        master = c.start_master(c.hosts[0], "--enable_offload", "--client_ttl=3",
                                "--default_kv_lease_ttl=300")
        holder = agent(c.hosts[1], master, SEG, offload=str(disk))
        writer = agent(c.hosts[2], master, 0)
        reader = agent(c.hosts[3], master, 0)
        w = writer.request({"op": "put_random", "prefix": "d-", "count": COUNT, "size": SIZE,
                            "retry_full": True}, timeout=300)
        assert w["rcs"] == [0] * COUNT, w["rcs"]
        keys = sorted(w["sha"])
        r = reader.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)
        assert r["sha"] == w["sha"], r["rc"]

        # Every object on the disk (eager offload writes within a heartbeat or two of the put;
        # what is only in memory when the holder is killed is lost, as without the tier).
        deadline = time.time() + 30
        while metric(c.hosts[0], "file_cache_nums_") < COUNT and time.time() < deadline:
            time.sleep(0.2)
        assert metric(c.hosts[0], "file_cache_nums_") == COUNT

        # SIGSTOP of the holder past its TTL (3 s): gets of its disk-only objects fail within a
        # bound, never hang; once it runs again it is told it was forgotten, mounts its disk
        # again, and every acknowledged object reads byte-exact once more.
        holder.stop()
        r = reader.request({"op": "get", "keys": keys[:4], "size": SIZE}, timeout=120)
        assert all(v < 0 for v in r["rc"].values()), r
        assert r["max_seconds"] < 15, r
        time.sleep(4)
        holder.cont()
        deadline = time.time() + 30
        while True:
            r = reader.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)
            if r["sha"] == w["sha"] or time.time() > deadline:
                break
            time.sleep(0.5)
        assert r["sha"] == w["sha"], r["rc"]

        # kill -9 of the holder's host: gets fail, promptly; after its TTL the keys are gone.
        holder.kill()
        holder.wait(10)
        r = reader.request({"op": "get", "keys": keys[:4], "size": SIZE}, timeout=120)
        assert all(v < 0 for v in r["rc"].values()), r
        assert r["max_seconds"] < 15, r
        time.sleep(4)
        r = reader.request({"op": "get", "keys": keys[:4], "size": SIZE}, timeout=120)
        assert all(v == -704 for v in r["rc"].values()), r

        # The holder restarts on the same directory: its objects are registered and served.
        holder = agent(c.hosts[1], master, SEG, offload=str(disk))
        deadline = time.time() + 30
        while True:
            r = reader.request({"op": "get", "keys": keys, "size": SIZE}, timeout=300)
            if r["sha"] == w["sha"] or time.time() > deadline:
                break
            time.sleep(0.5)
        assert r["sha"] == w["sha"], r["rc"]
