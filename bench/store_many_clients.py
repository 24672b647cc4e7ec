#!/usr/bin/env python3
"""Many Store clients on one host: aggregate and per-client ops/s of mixed puts and gets.

Starts our mooncake_master (free ports, its embedded HTTP metadata server), one holder process
lending a segment, then, for each client count N of --clients, N client processes at once.
Each client lends nothing, registers one buffer and, for --duration seconds (the same window
for all: they start together at a time given to them), repeats a cycle of
  batch_put_from 4 KiB x 128 (new keys), batch_get_into of them,
  batch_put_from 64 KiB x 16 (new keys), batch_get_into of them,
and removes (batch_remove, force: only its own reads hold leases, so the space is freed at
once) the keys of cycles older than the last --keep ones, so the pool never fills. Each client
has keys of its own. An op is one object put or got; a client reports its ops/s.

Prints, per N: the aggregate ops/s, each client's share of the mean (min / max), the master's
CPU use over the window (cores, and microseconds per op), and at the end the ratio
aggregate(N_max) / aggregate(1); with --json one JSON line.

  build/py-venv/bin/python bench/store_many_clients.py --clients 1,16 --duration 10 --json

The python running this script must import our `mooncake` package
(`MC_PY_INSTALL_ONLY=1 scripts/python_test.sh` installs it into build/py-venv).
"""
import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from store_compare import stop_processes  # bench/, beside this script

MIB = 1 << 20
CASES = ((4096, 128), (65536, 16))  # (block, batch)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_store(args, segment):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", args.metadata, segment, 16 * MIB, args.protocol, "", args.master)
    if rc != 0:
        sys.exit(f"setup failed: {rc}")
    return s


def client(args):
    store = make_store(args, 0)
    buf_size = max(b * n for b, n in CASES)
    buf = ctypes.create_string_buffer(buf_size)
    addr = ctypes.addressof(buf)
    if store.register_buffer(addr, buf_size) != 0:
        sys.exit("register_buffer failed")
    ctypes.memset(addr, args.index & 0xFF, buf_size)
    # Everyone is set up: wait for the common start.
    print("ready", flush=True)
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    end = args.start_at + args.duration
    ops = {"put": 0, "get": 0}
    lat = []
    old = []  # keys of each cycle, oldest first
    cycle = 0
    errors = []
    while time.time() < end:
        keys_of_cycle = []
        t0 = time.perf_counter()
        for block, batch in CASES:
            keys = [f"mc-{args.run}-{args.index}-{cycle}-{block}-{i}" for i in range(batch)]
            ptrs = [addr + i * block for i in range(batch)]
            sizes = [block] * batch
            rc = store.batch_put_from(keys, ptrs, sizes)
            bad = [r for r in rc if r != 0]
            if bad and not errors:
                errors.append(f"put {block}: {bad[:3]}")
            ops["put"] += batch - len(bad)
            rc = store.batch_get_into(keys, ptrs, sizes)
            bad = [r for r in rc if r != block]
            if bad and not errors:
                errors.append(f"get {block}: {bad[:3]}")
            ops["get"] += batch - len(bad)
            keys_of_cycle += keys
        lat.append(time.perf_counter() - t0)
        old.append(keys_of_cycle)
        if len(old) > args.keep:
            store.batch_remove(old.pop(0), True)
        cycle += 1
    wall = time.time() - args.start_at
    for keys in old:
        store.batch_remove(keys, True)
    lat.sort()
    out = {"index": args.index, "ops": ops["put"] + ops["get"], "puts": ops["put"],
           "gets": ops["get"], "cycles": cycle, "wall_s": wall,
           "ops_per_s": (ops["put"] + ops["get"]) / wall,
           "cycle_p50_ms": lat[len(lat) // 2] * 1e3 if lat else 0,
           "cycle_p99_ms": lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e3 if lat else 0,
           "errors": errors}
    print(json.dumps(out), flush=True)
    store.unregister_buffer(addr)
    store.close()
    os._exit(0)


def holder(args):
    store = make_store(args, args.segment)
    print("holder ready", flush=True)
    sys.stdin.read()
    store.close()


def cpu_seconds(pid):
    """utime + stime of a process (Linux /proc), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_clients(args, n, common, master_pid):
    me = os.path.abspath(__file__)
    start_at = time.time() + args.setup_s
    procs = [subprocess.Popen(
        [sys.executable, me, "client", "--index", str(i), "--run", f"{os.getpid()}n{n}",
         "--start_at", repr(start_at), "--duration", str(args.duration),
         "--keep", str(args.keep)] + common,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    # The master's CPU time over the measured window (from the common start to its end).
    while time.time() < start_at:
        time.sleep(0.01)
    cpu0 = cpu_seconds(master_pid)
    time.sleep(args.duration)
    master_cpu = cpu_seconds(master_pid) - cpu0
    results = []
    for p in procs:
        out, err = p.communicate(timeout=args.setup_s + args.duration + 120)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"client failed ({p.returncode}): {err[-1500:]}")
        results.append(json.loads(lines[-1]))
    if any(r["wall_s"] > args.duration * 1.5 for r in results):
        print(f"  note: a client started late (setup took over {args.setup_s} s)", flush=True)
    rates = [r["ops_per_s"] for r in results]
    mean = statistics.mean(rates)
    return {"clients": n, "aggregate_ops_per_s": sum(rates),
            "min_share": min(rates) / mean, "max_share": max(rates) / mean,
            "per_client_ops_per_s": rates,
            "cycle_p50_ms": statistics.median(r["cycle_p50_ms"] for r in results),
            "cycle_p99_ms_max": max(r["cycle_p99_ms"] for r in results),
            "master_cpu_share": master_cpu / args.duration,
            "master_cpu_us_per_op": master_cpu * 1e6 / max(1, sum(r["ops"] for r in results)),
            "errors": [e for r in results for e in r["errors"]][:3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", nargs="?", default="run", choices=["run", "holder", "client"])
    ap.add_argument("--master_bin", default="build/src/store/mooncake_master")
    ap.add_argument("--master_args", default="", help="more mooncake_master flags, space-separated")
    ap.add_argument("--clients", default="1,16", help="client counts to run, in order")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each client count")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per run")
    ap.add_argument("--setup_s", type=float, default=8.0,
                    help="seconds the clients get to set up before the common start")
    ap.add_argument("--segment", type=int, default=2 << 30, help="the holder's segment bytes")
    ap.add_argument("--keep", type=int, default=4, help="cycles of keys a client keeps stored")
    ap.add_argument("--protocol", default="tcp")
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    # Internal (holder / client processes).
    ap.add_argument("--master")
    ap.add_argument("--metadata")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--run", default="0")
    ap.add_argument("--start_at", type=float, default=0.0)
    args = ap.parse_args()
    if args.role == "holder":
        return holder(args)
    if args.role == "client":
        return client(args)

    rpc, http, metrics = free_port(), free_port(), free_port()
    common = ["--master", f"127.0.0.1:{rpc}", "--metadata",
              f"http://127.0.0.1:{http}/metadata", "--protocol", args.protocol]
    procs = []
    rows = []
    try:
        procs.append(subprocess.Popen(
            [args.master_bin, f"--rpc_port={rpc}", f"--metrics_port={metrics}",
             "--enable_http_metadata_server=true", f"--http_metadata_server_port={http}",
             "--http_metadata_server_host=127.0.0.1"] + args.master_args.split(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)
        me = os.path.abspath(__file__)
        h = subprocess.Popen([sys.executable, me, "holder", "--segment", str(args.segment)]
                             + common, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        procs.append(h)
        if "holder ready" not in h.stdout.readline():
            raise RuntimeError("the holder did not start")
        for n in [int(x) for x in args.clients.split(",") if x]:
            for rep in range(args.repeat):
                row = run_clients(args, n, common, procs[0].pid)
                row["repeat"] = rep
                rows.append(row)
                print(f"{n:3d} clients: aggregate {row['aggregate_ops_per_s']:9.0f} ops/s, "
                      f"per client min/max share of the mean {row['min_share']:.2f} / "
                      f"{row['max_share']:.2f}, cycle p50 {row['cycle_p50_ms']:.1f} ms, "
                      f"master CPU {row['master_cpu_share']:.2f} cores "
                      f"({row['master_cpu_us_per_op']:.1f} us/op)"
                      + (f", errors {row['errors']}" if row["errors"] else ""), flush=True)
    finally:
        stop_processes(procs)
    by_n = {}
    for r in rows:
        by_n.setdefault(r["clients"], []).append(r["aggregate_ops_per_s"])
    summary = {n: statistics.median(v) for n, v in by_n.items()}
    ns = sorted(summary)
    ratio = summary[ns[-1]] / summary[ns[0]] if len(ns) > 1 and summary[ns[0]] else None
    if ratio is not None:
        print(f"aggregate at {ns[-1]} clients / at {ns[0]}: {ratio:.2f} (medians of "
              f"{args.repeat} run(s))")
    if args.json:
        print(json.dumps({"bench": "store_many_clients", "duration_s": args.duration,
                          "cases": CASES, "rows": rows,
                          "median_aggregate": {str(n): v for n, v in summary.items()},
                          "ratio": ratio}))


if __name__ == "__main__":
    main()
