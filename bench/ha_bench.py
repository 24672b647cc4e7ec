#!/usr/bin/env python3
"""Master HA on etcd (issue 29): what the replicated log costs, and how long a failover takes.

On 127.0.0.1: one etcd member (its own data dir, free ports) and our mooncake_master.
  1. cost: one Store client (lending a 1 GiB segment, P2P handshake) repeats batch_put_from of
     4 KiB x 128 new keys for --duration seconds (removing keys older than 8 batches), against
     a master without HA, then against an HA leader with --enable_oplog (every reply held
     until its changes are durable in etcd) and with --oplog_ack_before_durable; per-batch
     p50 / p99 latency and puts/s, and the HA / plain ratios;
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


def store_for(master_addr, cluster):
    from mooncake.store import MooncakeDistributedStore
    os.environ["MC_STORE_CLUSTER_ID"] = cluster
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 1024 * MIB, 16 * MIB, "tcp", "", master_addr)
    if rc != 0:
        sys.exit(f"setup against {master_addr} failed: {rc}")
    return s


def cost_run(store, tag, duration):
    block, batch = 4096, 128
    buf = ctypes.create_string_buffer(block * batch)
    addr = ctypes.addressof(buf)
    assert store.register_buffer(addr, len(buf)) == 0
    lat, old, puts, failed, i = [], [], 0, 0, 0
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
    return {"batches": i, "puts_per_s": puts / duration, "failed": failed,
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
    args = ap.parse_args()
    etcd_bin = shutil.which("etcd") or "/usr/bin/etcd"
    work = tempfile.mkdtemp(prefix="ha_bench.")
    cport, pport = free_port(), free_port()
    etcd = subprocess.Popen(
        [etcd_bin, "--name", "b", "--data-dir", os.path.join(work, "etcd"),
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

        # 1. cost
        for mode, flags, cluster in (("plain", [], ""),
                                     ("ha", ha("cost"), "cost"),
                                     ("ha_ack_before_durable",
                                      ha("costa", "--oplog_ack_before_durable=true"), "costa")):
            m = Master(args.master_bin, work, flags)
            masters.append(m)
            wait(m.serving, 20, f"{mode} master serving")
            addr = f"etcd://{endpoints}" if cluster else f"127.0.0.1:{m.rpc}"
            s = store_for(addr, cluster or "mooncake_cluster")
            out[mode] = cost_run(s, mode, args.duration)
            s.close()
            m.stop()
        for mode in ("ha", "ha_ack_before_durable"):
            out[mode]["puts_ratio_to_plain"] = out[mode]["puts_per_s"] / out["plain"]["puts_per_s"]
            out[mode]["p50_ratio_to_plain"] = out[mode]["p50_ms"] / out["plain"]["p50_ms"]

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
        log, stop, acked = [], threading.Event(), []

        def fill(key):
            ctypes.memset(addr, hash(key) & 0xFF, 4096)

        def putter():
            i = 0
            while not stop.is_set():
                key = f"fo-{i}"
                fill(key)
                rc = s.put_from(key, addr, 4096)
                log.append((time.monotonic(), rc))
                if rc == 0:
                    acked.append(key)
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
        lost, wrong = 0, 0
        for key in acked:
            ctypes.memset(addr, 0, 4096)
            n = s.get_into(key, addr, 4096)
            if n != 4096:
                lost += 1
            elif buf.raw != bytes([hash(key) & 0xFF]) * 4096:
                wrong += 1
        kills = [x for x in rounds if x["kind"] == "kill -9"]
        out["failover"] = {
            "lease_ttl_s": 5, "rounds": rounds,
            "clean_stop_serving_after_s": rounds[0]["standby_serving_after_s"],
            "kill9_serving_after_s_max": max(x["standby_serving_after_s"] for x in kills),
            "kill9_put_gap_s_max": max(x["longest_put_gap_s"] or 0 for x in kills),
            "acknowledged_puts": len(acked), "failed_puts": sum(1 for _, rc in log if rc != 0),
            "acknowledged_lost": lost, "acknowledged_wrong_bytes": wrong}
        s.unregister_buffer(addr)
        s.close()
        for m in ms:
            m.stop()

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
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
