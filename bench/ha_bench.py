#!/usr/bin/env python3
"""Master HA on etcd (issue 29): what the replicated log costs, and how long a failover takes.

On 127.0.0.1: one etcd member (its own data dir, free ports) and our mooncake_master.
  1. cost: N Store client processes (--cost_clients, each lending 1 GiB / N, P2P handshake)
     each repeat batch_put_from of 4 KiB x 128 new keys for --duration seconds (removing keys
     older than 8 batches), against a master without HA, then against an HA leader with
     --enable_oplog (every reply held until its changes are durable in etcd) and with
     --oplog_ack_before_durable; per-batch p50 / p99 latency and puts/s, and the HA / plain
     ratios (concurrent clients share the writer's etcd transactions: group commit);
  2. failover: two HA masters; the client puts single 4 KiB objects in a loop while the leader
     is stopped cleanly once, then killed (kill -9) --failovers times (each killed master
     restarted as a standby); per round when the standby serves and the longest gap between
     two acknowledged puts (the outage a client sees); at the end every acknowledged put is
     read back and its bytes checked;
  3. catch-up: --objects objects put through the leader (batches of 128), then a new standby
     started: time until it has applied the whole log (its /metrics), etcd's db size, and the
     checkpoint the leader wrote (--oplog_checkpoint_entries 100000);
  4. churn: --churn puts and removes (batches of 128, 8 batches live) through an HA leader,
     etcd's db size (and in use) sampled ten times: bounded by the checkpoints' compaction.

  build/py-venv/bin/python bench/ha_bench.py --duration 10 --objects 100000 --json

The python running this script must import our `mooncake` package (`MC_PY_INSTALL_ONLY=1
scripts/python_test.sh` installs it into build/py-venv); etcd from Debian's etcd-server.
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.02)


def http(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.read().decode()
    except Exception:
        return None


def metric(port, name):
    text = http(port, "/metrics") or ""
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


class Master:
    def __init__(self, binary, logdir, flags):
        self.rpc, self.http = free_port(), free_port()
        self.log = open(os.path.join(logdir, f"master-{self.rpc}.log"), "w")
        self.p = subprocess.Popen([binary, "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc}",
                                   f"--metrics_port={self.http}", *flags],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        wait(lambda: http(self.http, "/health") is not None, 20, "the master's /health")

    def serving(self):
        h = http(self.http, "/health")
        return h is not None and json.loads(h).get("service_ready") is True

    def stop(self, sig=15):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def etcd_status(endpoints):
    st = subprocess.run(["etcdctl", f"--endpoints=http://{endpoints}", "endpoint", "status",
                         "-w", "json"], capture_output=True, text=True,
                        env={**os.environ, "ETCDCTL_API": "3"})
    return json.loads(st.stdout)[0]["Status"] if st.returncode == 0 else {}


def percentile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))] if v else 0.0


def store_for(master_addr, cluster, segment=1024 * MIB):
    from mooncake.store import MooncakeDistributedStore
    os.environ["MC_STORE_CLUSTER_ID"] = cluster
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 * MIB, "tcp", "", master_addr)
    if rc != 0:
        raise RuntimeError(f"setup against {master_addr} failed: {rc}")
    return s


def cost_run(store, tag, duration, start_at=None):
    block, batch = 4096, 128
    buf = ctypes.create_string_buffer(block * batch)
    addr = ctypes.addressof(buf)
    assert store.register_buffer(addr, len(buf)) == 0
    lat, old, puts, failed, i = [], [], 0, 0, 0
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + duration
    while time.monotonic() < end:
        keys = [f"{tag}-{i}-{k}" for k in range(batch)]
        t = time.perf_counter()
        rc = store.batch_put_from(keys, [addr + k * block for k in range(batch)], [block] * batch)
        lat.append(time.perf_counter() - t)
        puts += sum(1 for r in rc if r == 0)
        failed += sum(1 for r in rc if r != 0)
        old.append(keys)
        if len(old) > 8:
            store.batch_remove(old.pop(0), True)
        i += 1
    for keys in old:
        store.batch_remove(keys, True)
    store.unregister_buffer(addr)
    return {"batches": i, "puts": puts, "failed": failed, "lat": lat}


def cost_worker(master_addr, cluster, tag, duration, segment, start_at, q, done):
    """One client process of a concurrent cost run (its own engine and segment)."""
    try:
        s = store_for(master_addr, cluster, segment)
    except RuntimeError as e:
        q.put({"error": str(e)})
        return
    r = cost_run(s, tag, duration, start_at)
    done.wait(60)  # no client leaves (its segment unmounted) while others still put into it
    s.close()
    q.put(r)


def cost_clients(master_addr, cluster, tag, duration, clients):
    """`clients` processes put concurrently (batches of 128 x 4 KiB) for `duration` s."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    done = ctx.Barrier(clients)
    start_at = time.time() + 3.0 + 0.5 * clients  # every client set up by then
    procs = [ctx.Process(target=cost_worker,
                         args=(master_addr, cluster, f"{tag}-c{c}", duration,
                               max(64 * MIB, 1024 * MIB // clients), start_at, q, done))
             for c in range(clients)]
    for p in procs:
        p.start()
    rs = [q.get(timeout=duration + 120) for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in rs if "error" in r]
    if errors:
        sys.exit(errors[0])
    lat = [x for r in rs for x in r["lat"]]
    return {"clients": clients, "batches": sum(r["batches"] for r in rs),
            "puts_per_s": sum(r["puts"] for r in rs) / duration,
            "failed": sum(r["failed"] for r in rs),
            "p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--master_bin", default="build/src/store/mooncake_master")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--objects", type=int, default=100000)
    ap.add_argument("--failovers", type=int, default=20,
                    help="kill -9 rounds (each: the leader killed, then restarted as a standby)")
    ap.add_argument("--churn", type=int, default=1000000,
                    help="puts (and removes) through an HA leader while etcd's size is sampled")
    ap.add_argument("--churn_ack_before_durable", action="store_true",
                    help="churn with --oplog_ack_before_durable (the same log, written faster)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--phases", default="cost,failover,catch_up,churn",
                    help="which of cost,failover,catch_up,churn to run")
    ap.add_argument("--cost_clients", default="1,4",
                    help="client process counts of the cost phase (each puts concurrently)")
    ap.add_argument("--etcd_data_dir", default=None,
                    help="etcd's data dir (default: under a temporary dir on this disk; "
                         "/dev/shm/... shows what the log costs without the disk's fsync)")
    args = ap.parse_args()
    etcd_bin = shutil.which("etcd") or "/usr/bin/etcd"
    work = tempfile.mkdtemp(prefix="ha_bench.")
    cport, pport = free_port(), free_port()
    etcd_dir = (os.path.join(args.etcd_data_dir, f"ha_bench-etcd-{os.getpid()}")
                if args.etcd_data_dir else os.path.join(work, "etcd"))
    etcd = subprocess.Popen(
        [etcd_bin, "--name", "b", "--data-dir", etcd_dir,
         "--listen-client-urls", f"http://127.0.0.1:{cport}",
         "--advertise-client-urls", f"http://127.0.0.1:{cport}",
         "--listen-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-cluster", f"b=http://127.0.0.1:{pport}"],
        stdout=open(os.path.join(work, "etcd.log"), "w"), stderr=subprocess.STDOUT)
    endpoints = f"127.0.0.1:{cport}"
    wait(lambda: http(cport, "/health") is not None, 20, "etcd")
    masters, out = [], {}
    try:
        def ha(cluster, *more):
            return ["--enable_ha=true", f"--ha_backend_connstring={endpoints}",
                    "--enable_oplog=true", f"--cluster_id={cluster}", *more]

        phases = args.phases.split(",")
        block, batch = 4096, 128
        # 1. cost: per mode and client count, a fresh master (and cluster id)
        modes = (("plain", []), ("ha", []), ("ha_ack_before_durable",
                                            ["--oplog_ack_before_durable=true"]))
        clients_list = [int(c) for c in args.cost_clients.split(",")]
        for mode, more in modes if "cost" in phases else ():
            out[mode] = {}
            for n in clients_list:
                cluster = f"cost{len(masters)}" if mode != "plain" else ""
                flags = ha(cluster, *more) if cluster else []
                m = Master(args.master_bin, work, flags)
                masters.append(m)
                wait(m.serving, 20, f"{mode} master serving")
                addr = f"etcd://{endpoints}" if cluster else f"127.0.0.1:{m.rpc}"
                out[mode][n] = cost_clients(addr, cluster or "mooncake_cluster", mode,
                                            args.duration, n)
                m.stop()
        for mode, _ in modes[1:] if "cost" in phases else ():
            for n in clients_list:
                r, p = out[mode][n], out["plain"][n]
                r["puts_ratio_to_plain"] = r["puts_per_s"] / p["puts_per_s"]
                r["p50_ratio_to_plain"] = r["p50_ms"] / p["p50_ms"]

        if "failover" in phases:
            # 2. failover: a clean stop, then --failovers kill -9 rounds; every acknowledged put
            # is read back at the end (its bytes: the key's hash, 4 KiB).
            ms = [Master(args.master_bin, work, ha("fo", "--ha_lease_ttl_sec=5"))]
            masters.extend(ms)
            wait(ms[0].serving, 20, "the first HA master serving")
            ms.append(Master(args.master_bin, work, ha("fo", "--ha_lease_ttl_sec=5")))
            masters.append(ms[1])
            s = store_for(f"etcd://{endpoints}", "fo")
            buf = ctypes.create_string_buffer(4096)
            addr = ctypes.addressof(buf)
            assert s.register_buffer(addr, 4096) == 0
            log, stop, acked, put_times, kill_times = [], threading.Event(), [], {}, []

            def fill(key):
                ctypes.memset(addr, hash(key) & 0xFF, 4096)

            def putter():
                i = 0
                while not stop.is_set():
                    key = f"fo-{i}"
                    fill(key)
                    t_start = time.monotonic()
                    rc = s.put_from(key, addr, 4096)
                    log.append((time.monotonic(), rc))
                    if rc == 0:
                        acked.append(key)
                        put_times[key] = (t_start, time.monotonic())
                    i += 1

            def longest_gap(since):
                ok = [t for t, rc in log if rc == 0 and t >= since]
                return max((b2 - b1 for b1, b2 in zip(ok, ok[1:])), default=None)

            def leader_of(pair):
                wait(lambda: any(m.serving() for m in pair), 30, "a leader")
                return next(m for m in pair if m.serving())

            th = threading.Thread(target=putter)
            th.start()
            time.sleep(1.0)
            rounds = []
            for r in range(args.failovers + 1):
                lead = leader_of(ms)
                other = ms[1] if lead is ms[0] else ms[0]
                t0 = time.monotonic()
                kill_times.append(t0)
                lead.stop(15 if r == 0 else 9)  # round 0: a clean stop (the lease revoked)
                wait(other.serving, 30, "the standby taking over")
                promoted = time.monotonic() - t0
                time.sleep(1.0)
                rounds.append({"kind": "clean stop" if r == 0 else "kill -9",
                               "standby_serving_after_s": promoted,
                               "longest_put_gap_s": longest_gap(t0 - 0.5)})
                fresh = Master(args.master_bin, work, ha("fo", "--ha_lease_ttl_sec=5"))
                masters.append(fresh)
                ms = [other, fresh]
                time.sleep(0.5)
            stop.set()
            th.join()
            lost, wrong, lost_keys = 0, 0, []
            for key in acked:
                ctypes.memset(addr, 0, 4096)
                n = s.get_into(key, addr, 4096)
                if n != 4096:  # once more after a second: a transient error is not a loss
                    time.sleep(1.0)
                    first_rc, n = n, s.get_into(key, addr, 4096)
                if n != 4096:
                    lost += 1
                    a0, a1 = put_times[key]
                    near = min(kill_times, key=lambda k: abs(k - a0))
                    lost_keys.append({"key": key, "get_rc": [first_rc, n],
                                      "put_began_s_after_kill": a0 - near,
                                      "put_took_s": a1 - a0})
                elif buf.raw != bytes([hash(key) & 0xFF]) * 4096:
                    wrong += 1
            kills = [x for x in rounds if x["kind"] == "kill -9"]
            out["failover"] = {
                "lease_ttl_s": 5, "rounds": rounds,
                "clean_stop_serving_after_s": rounds[0]["standby_serving_after_s"],
                "kill9_serving_after_s_max": max(x["standby_serving_after_s"] for x in kills),
                "kill9_put_gap_s_max": max(x["longest_put_gap_s"] or 0 for x in kills),
                "acknowledged_puts": len(acked), "failed_puts": sum(1 for _, rc in log if rc != 0),
                "acknowledged_lost": lost, "acknowledged_wrong_bytes": wrong,
                "lost": lost_keys[:10]}
            s.unregister_buffer(addr)
            s.close()
            for m in ms:
                m.stop()

        if "catch_up" in phases:
            # 3. catch-up after --objects objects
            lead = Master(args.master_bin, work, ha("cu"))
            masters.append(lead)
            wait(lead.serving, 20, "the catch-up leader serving")
            s = store_for(f"etcd://{endpoints}", "cu")
            block, batch = 4096, 128
            buf = ctypes.create_string_buffer(block * batch)
            addr = ctypes.addressof(buf)
            assert s.register_buffer(addr, len(buf)) == 0
            t = time.monotonic()
            done = 0
            while done < args.objects:
                n = min(batch, args.objects - done)
                keys = [f"cu-{done + k}" for k in range(n)]
                rc = s.batch_put_from(keys, [addr + k * block for k in range(n)], [block] * n)
                assert all(r == 0 for r in rc), rc[:3]
                done += n
            put_s = time.monotonic() - t
            last = metric(lead.http, "ha_oplog_last_sequence_id")
            t = time.monotonic()
            late = Master(args.master_bin, work, ha("cu"))
            masters.append(late)
            wait(lambda: (metric(late.http, "ha_oplog_applied_sequence_id") or 0) >= last, 300,
                 "the late standby catching up")
            catch_up = time.monotonic() - t
            db = etcd_status(endpoints)
            out["catch_up"] = {"objects": args.objects, "put_s": put_s, "log_entries": last,
                               "checkpoint_seq": metric(lead.http, "master_ha_checkpoint_sequence_id"),
                               "standby_caught_up_s": catch_up,
                               "etcd_db_size_bytes": db.get("dbSize"),
                               "etcd_db_size_in_use_bytes": db.get("dbSizeInUse")}
            s.unregister_buffer(addr)
            s.close()
            lead.stop()
            late.stop()

        if "churn" in phases:
            # 4. churn: --churn puts and removes; etcd's size sampled ten times.
            flags = ha("churn")
            if args.churn_ack_before_durable:
                flags.append("--oplog_ack_before_durable=true")
            lead = Master(args.master_bin, work, flags)
            masters.append(lead)
            wait(lead.serving, 20, "the churn leader serving")
            s = store_for(f"etcd://{endpoints}", "churn")
            buf = ctypes.create_string_buffer(block * batch)
            addr = ctypes.addressof(buf)
            assert s.register_buffer(addr, len(buf)) == 0
            samples, old, done, i = [], [], 0, 0
            t = time.monotonic()
            step = max(batch, args.churn // 10)
            while done < args.churn:
                keys = [f"ch-{i}-{k}" for k in range(batch)]
                rc = s.batch_put_from(keys, [addr + k * block for k in range(batch)], [block] * batch)
                done += sum(1 for r in rc if r == 0)
                old.append(keys)
                if len(old) > 8:
                    s.batch_remove(old.pop(0), True)
                i += 1
                if done // step != (done - batch) // step:
                    st = etcd_status(endpoints)
                    samples.append({"puts": done, "s": time.monotonic() - t,
                                    "db_size": st.get("dbSize"), "db_in_use": st.get("dbSizeInUse"),
                                    "checkpoint_seq": metric(lead.http,
                                                             "master_ha_checkpoint_sequence_id")})
            out["churn"] = {"puts_and_removes": done, "ack_before_durable": args.churn_ack_before_durable,
                            "seconds": time.monotonic() - t, "samples": samples}
            s.unregister_buffer(addr)
            s.close()
    finally:
        for m in masters:
            m.stop()
        etcd.terminate()
        etcd.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(etcd_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
