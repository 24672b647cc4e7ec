#!/usr/bin/env python3
"""Replica tasks: how fast create_copy_task moves objects from one holder to another.

Starts our mooncake_master (free ports), then per transport (same host: the engines' shm
path; tcp: MC_FORCE_TCP=1) a child process with two holders (a, b: each lends --segment
bytes) and a user (lends nothing). The user puts --count objects of each --sizes onto a
(preferred_segment), then creates one copy task per object to b at once and polls query_task
until every task has ended. Reported per size: the put rate of the same objects (for scale:
user -> a through the engine), the copy rate (objects/s and GB/s, from the first create to
the last SUCCESS), and whether every copy succeeded and reads back byte-exact from b alone
(a closed first).

  build/py-venv/bin/python bench/replica_tasks_bench.py --count 64 --sizes 65536,1048576

The python running this script must import our `mooncake` package
(`MC_PY_INSTALL_ONLY=1 scripts/python_test.sh` installs it into build/py-venv).
"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIB = 1 << 20


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child(args):
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig, TaskStatus

    def store(segment):
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 64 * MIB, "tcp", "",
                       args.master) == 0
        return s

    a, b, user = store(args.segment), store(args.segment), store(0)
    out = []
    for size in args.sizes:
        cfg = ReplicateConfig()
        cfg.preferred_segment = a.get_hostname()
        values = [os.urandom(size) for _ in range(args.count)]
        keys = [f"rt-{size}-{i}" for i in range(args.count)]
        t0 = time.perf_counter()
        for k, v in zip(keys, values):
            assert user.put(k, v, cfg) == 0
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = []
        for k in keys:
            task_id, rc = user.create_copy_task(k, [b.get_hostname()])
            assert rc == 0, rc
            ids.append(task_id)
        ended, ok = set(), 0
        while len(ended) < len(ids):
            for i, task_id in enumerate(ids):
                if i in ended:
                    continue
                resp, rc = user.query_task(task_id)
                if resp is not None and resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
                    ended.add(i)
                    ok += resp.status == TaskStatus.SUCCESS
            time.sleep(0.001)
        copy_s = time.perf_counter() - t0
        out.append({"size": size, "count": args.count, "put_ops": args.count / put_s,
                    "copy_ops": args.count / copy_s,
                    "copy_gbps": args.count * size / copy_s / 1e9, "succeeded": ok,
                    "keys": keys, "values_sha": [hash(v) for v in values]})
    a.close()  # the copies on b must hold every object alone now
    for r in out:
        exact = 0
        for k, h in zip(r.pop("keys"), r.pop("values_sha")):
            exact += hash(user.get(k)) == h
        r["byte_exact_from_b"] = exact
    print(json.dumps(out), flush=True)
    user.close()
    b.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=64)
    p.add_argument("--sizes", default="65536,1048576")
    p.add_argument("--segment", type=int, default=512 * MIB)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        return child(args)
    rpc, metrics = free_port(), free_port()
    master = subprocess.Popen([str(ROOT / "build/src/store/mooncake_master"),
                               f"--rpc_port={rpc}", f"--metrics_port={metrics}",
                               "--rpc_address=127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        results = {}
        for mode, env in (("same host", {}), ("tcp", {"MC_FORCE_TCP": "1"})):
            r = subprocess.run([sys.executable, __file__, "--child", f"--master=127.0.0.1:{rpc}",
                                f"--count={args.count}", f"--segment={args.segment}",
                                "--sizes=" + ",".join(map(str, args.sizes))],
                               env={**os.environ, **env, "GLOG_minloglevel": "2"},
                               capture_output=True, text=True, timeout=600)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
            if r.returncode != 0 or not lines:
                sys.exit(f"{mode}: child failed: {r.stderr[-2000:]}")
            results[mode] = json.loads(lines[-1])
    finally:
        master.terminate()
        master.wait(10)
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'transport':<10} {'size':>9} {'puts/s':>9} {'copies/s':>9} {'copy GB/s':>9} "
          f"{'ok':>5} {'exact':>5}")
    for mode, rows in results.items():
        for r in rows:
            print(f"{mode:<10} {r['size']:>9} {r['put_ops']:>9.0f} {r['copy_ops']:>9.0f} "
                  f"{r['copy_gbps']:>9.2f} {r['succeeded']:>5} {r['byte_exact_from_b']:>5}")


if __name__ == "__main__":
    main()
