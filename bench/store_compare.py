#!/usr/bin/env python3
"""The Store beside upstream's, through the Python API both share (run under either package).

One process per role, started by bench/run.py (or by hand) with the python of the venv whose
`mooncake` package it measures:
  holder  lends a segment (global_segment_size) and waits until its stdin closes;
  client  lends nothing, registers a buffer and measures, printing one JSON line:
    - meta: single-key master calls (is_exist, get_size, remove, get of a small object) from 1
      and 8 threads, calls/s and p50 / p99 latency;
    - data: batch_put_from / batch_get_into of (block, batch) cases, ops/s and GB/s: a
      warm-up fills 60% of the pool once (untimed, so that the pool's pages are in), then
      timed puts (every key new) stop before the pool is 60% full, the gets cycle over the
      keys put, and remove_all(force=True) empties the pool for the next case.

  python bench/store_compare.py holder --master 127.0.0.1:50051 --metadata http://...
  python bench/store_compare.py client --master 127.0.0.1:50051 --metadata http://... \
      --protocol tcp --duration 2
"""
import argparse
import ctypes
import json
import os
import sys
import threading
import time

MIB = 1 << 20


def make_store(args, segment):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup(args.host, args.metadata, segment, 16 * MIB, args.protocol, "", args.master)
    if rc != 0:
        sys.exit(f"setup failed: {rc}")
    return s


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def timed_calls(fn, keys_per_thread, threads):
    """Runs fn(key) over each thread's keys; aggregate calls/s, p50 / p99 latency in us."""
    lat = [[] for _ in range(threads)]
    errors = []
    barrier = threading.Barrier(threads + 1)

    def work(t):
        mine = lat[t]
        barrier.wait()
        for k in keys_per_thread[t]:
            t0 = time.perf_counter()
            r = fn(k)
            mine.append(time.perf_counter() - t0)
            if isinstance(r, int) and r < 0 and not errors:
                errors.append(r)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    allv = [x for l in lat for x in l]
    return {"calls_per_s": len(allv) / wall, "p50_us": percentile(allv, 0.5) * 1e6,
            "p99_us": percentile(allv, 0.99) * 1e6, "errors": errors[:1]}


def meta(store, args):
    out = []
    n = args.meta_calls
    value = b"x" * 64
    for threads in args.threads:
        keys = [[f"meta-{threads}-{t}-{i}" for i in range(n)] for t in range(threads)]
        # The objects the calls look at: every key exists (is_exist / get_size / get hit).
        flat = [k for ks in keys for k in ks]
        for i in range(0, len(flat), 512):
            chunk = flat[i:i + 512]
            store.put_batch(chunk, [value] * len(chunk))
        row = {"threads": threads}
        row["is_exist"] = timed_calls(store.is_exist, keys, threads)
        row["get_size"] = timed_calls(store.get_size, keys, threads)
        row["get"] = timed_calls(store.get, keys, threads)
        row["remove"] = timed_calls(lambda k: store.remove(k, True), keys, threads)
        out.append(row)
    return out


def data(store, args, buf, buf_size):
    out = []
    pool_budget = int(args.segment * 0.6)
    run_id = os.getpid()
    for block, batch in args.cases:
        per_batch = block * batch
        assert per_batch <= buf_size
        ptrs = [buf + i * block for i in range(batch)]
        sizes = [block] * batch
        max_batches = max(1, pool_budget // per_batch)
        res = {"block": block, "batch": batch}
        # Warm-up, not timed: the pool's pages are touched once (a fresh segment's first
        # writes fault its pages in, under either package), as in a store that has run a while.
        warm = []
        for b in range(max_batches):
            keys = [f"w{run_id}-{block}-{b}-{i}" for i in range(batch)]
            if any(r != 0 for r in store.batch_put_from(keys, ptrs, sizes)):
                break
            warm.append(keys)
        store.remove_all(True)
        # put: new keys every batch, until the duration or the pool budget ends.
        batches = []
        t0 = time.perf_counter()
        lat = []
        while len(batches) < max_batches and time.perf_counter() - t0 < args.duration:
            keys = [f"d{run_id}-{block}-{len(batches)}-{i}" for i in range(batch)]
            s = time.perf_counter()
            rc = store.batch_put_from(keys, ptrs, sizes)
            lat.append(time.perf_counter() - s)
            if any(r != 0 for r in rc):
                sys.exit(f"batch_put_from {block}: {[r for r in rc if r != 0][:3]}")
            batches.append(keys)
        wall = time.perf_counter() - t0
        n = len(batches) * batch
        res["put"] = {"ops_per_s": n / wall, "gbps": n * block / wall / 1e9,
                      "batch_p50_us": percentile(lat, 0.5) * 1e6,
                      "batch_p99_us": percentile(lat, 0.99) * 1e6, "batches": len(batches)}
        lat = []
        done = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.duration:
            keys = batches[done % len(batches)]
            s = time.perf_counter()
            rc = store.batch_get_into(keys, ptrs, sizes)
            lat.append(time.perf_counter() - s)
            if any(r != block for r in rc):
                sys.exit(f"batch_get_into {block}: {[r for r in rc if r != block][:3]}")
            done += 1
        wall = time.perf_counter() - t0
        n = done * batch
        res["get"] = {"ops_per_s": n / wall, "gbps": n * block / wall / 1e9,
                      "batch_p50_us": percentile(lat, 0.5) * 1e6,
                      "batch_p99_us": percentile(lat, 0.99) * 1e6, "batches": done}
        store.remove_all(True)
        out.append(res)
    return out


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_pair(python, master_bin, protocol, extra, log=print, env=None):
    """Starts a master (with its HTTP metadata server), a holder and a client under `python`;
    returns the client's figures. `extra`: more client arguments."""
    import subprocess
    rpc, http, metrics = free_port(), free_port(), free_port()
    me = os.path.abspath(__file__)
    common = ["--master", f"127.0.0.1:{rpc}", "--metadata", f"http://127.0.0.1:{http}/metadata",
              "--protocol", protocol]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [master_bin, f"--rpc_port={rpc}", f"--metrics_port={metrics}",
             "--enable_http_metadata_server=true", f"--http_metadata_server_port={http}",
             "--http_metadata_server_host=127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        time.sleep(1.0)
        holder = subprocess.Popen([python, me, "holder"] + common, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  env=env)
        procs.append(holder)
        if "holder ready" not in holder.stdout.readline():
            raise RuntimeError(f"{python}: the store holder did not start")
        out = subprocess.run([python, me, "client"] + common + extra, capture_output=True,
                             text=True, timeout=900, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{python} client: {out.stderr[-1500:]}")
        return json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    finally:
        stop_processes(procs)


def stop_processes(procs):
    """Closes their stdin, terminates them in reverse order, kills what is left after 10 s."""
    import subprocess
    for p in reversed(procs):
        if p.stdin:
            p.stdin.close()
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


META_CALLS = ("is_exist", "get_size", "remove", "get")


def compare(repo, build, quick, log=print):
    """bench/run.py's Store-vs-upstream section: the same client workload under upstream's
    wheel (build/upstream-venv) and ours (build/py-venv: `make pytest-python` or
    `MC_PY_INSTALL_ONLY=1 scripts/python_test.sh` installs it), ours also with
    MC_FORCE_TCP=1. Returns (results, markdown)."""
    import pathlib
    repo, build = pathlib.Path(repo), pathlib.Path(build)
    extra = ["--meta_calls", "500" if quick else "3000", "--duration", "0.3" if quick else "2",
             "--cases", "4096x128,1048576x16" if quick else "4096x128,65536x64,1048576x16"]
    runs = [("upstream", repo / "build/upstream-venv/bin/python",
             repo / "build/upstream-venv/bin/mooncake_master", None),
            ("ours", build / "py-venv/bin/python", build / "src/store/mooncake_master", None),
            ("ours, tcp only", build / "py-venv/bin/python", build / "src/store/mooncake_master",
             dict(os.environ, MC_FORCE_TCP="1"))]
    results = {}
    for name, py, master, env in runs:
        if not py.exists() or not master.exists():
            log(f"store compare: {name} skipped ({py if not py.exists() else master} missing)")
            continue
        try:
            results[name] = run_pair(str(py), str(master), "tcp", extra, env=env)
            if name == "ours, tcp only":
                results[name]["meta"] = []  # the master calls do not depend on the transport
        except Exception as e:  # noqa: BLE001 - one side failing must not lose the other
            log(f"store compare: {name} failed: {e}")
    return results, markdown(results)


def scale(repo, build, quick, log=print):
    """bench/run.py's Store scale section: tools/master_bench (the master filled in process:
    per-op latency and bytes per object from 10 thousand to 10 million objects) and
    bench/store_many_clients.py (1 vs 16 client processes of mixed puts and gets). Returns
    (results, markdown); each tool's own table goes into the markdown as it printed it."""
    import pathlib
    import subprocess
    repo, build = pathlib.Path(repo), pathlib.Path(build)
    results, md = {}, []
    mb = build / "tools" / "master_bench"
    if mb.exists():
        args = ([str(mb), "--objects=200000", "--checkpoints=10000,100000,200000",
                 "--samples=2000", "--batch_samples=50"] if quick else
                [str(mb), "--objects=10000000"])
        try:
            out = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=1800)
            lines = out.stdout.splitlines()
            js = [l for l in lines if l.startswith("{")]
            results["master_bench"] = json.loads(js[-1]) if js else None
            md += [f"`{' '.join(['tools/master_bench'] + args[1:])}`:", "", "```"] + \
                  [l for l in lines if not l.startswith("{")] + ["```", ""]
        except Exception as e:  # noqa: BLE001
            log(f"master_bench failed: {e}")
    else:
        log(f"{mb} missing: master scale skipped")
    py = build / "py-venv" / "bin" / "python"
    mc = repo / "bench" / "store_many_clients.py"
    master = build / "src" / "store" / "mooncake_master"
    if py.exists() and mc.exists() and master.exists():
        args = ["--clients", "1,4" if quick else "1,16", "--duration", "2" if quick else "10",
                "--master_bin", str(master)]
        try:
            out = subprocess.run([str(py), str(mc)] + args + ["--json"], capture_output=True,
                                 text=True, timeout=1800, cwd=str(repo))
            lines = out.stdout.splitlines()
            js = [l for l in lines if l.startswith("{")]
            results["many_clients"] = json.loads(js[-1]) if js else None
            if out.returncode != 0:
                log(f"store_many_clients exit {out.returncode}: {out.stderr[-800:]}")
            md += [f"`bench/store_many_clients.py {' '.join(args[:4])}`:", "", "```"] + \
                  [l for l in lines if not l.startswith("{")] + ["```", ""]
        except Exception as e:  # noqa: BLE001
            log(f"store_many_clients failed: {e}")
    else:
        log("store_many_clients skipped (build/py-venv or the master missing)")
    return results, "\n".join(md) + "\n"


def markdown(results):
    names = [n for n in ("upstream", "ours", "ours, tcp only") if n in results]
    if not names:
        return "(no Store comparison: neither package could run)\n"
    out = ["Single-key master calls (calls/s, p50 / p99 µs; each thread its own keys, 64-byte "
           "objects, one process lending the pool, the caller lending nothing):", "",
           "| call | threads | " + " | ".join(f"{n} calls/s | {n} p50 / p99" for n in names[:2])
           + (" | ours / upstream |" if len(names) > 1 and names[0] == "upstream" else " |"),
           "|---|---|" + "---|---|" * len(names[:2]) + ("---|" if len(names) > 1 else "")]
    metas = {n: {m["threads"]: m for m in results[n]["meta"]} for n in names[:2]}
    threads = sorted({t for n in metas for t in metas[n]})
    for call in META_CALLS:
        for t in threads:
            cells, vals = [], []
            for n in names[:2]:
                m = metas[n].get(t, {}).get(call)
                if m is None:
                    cells.append("— | —")
                    vals.append(None)
                    continue
                err = f" (error {m['errors'][0]})" if m.get("errors") else ""
                cells.append(f"{m['calls_per_s']:,.0f}{err} | {m['p50_us']:.0f} / {m['p99_us']:.0f}")
                vals.append(m["calls_per_s"])
            ratio = (f" {vals[1] / vals[0]:.2f}x |" if len(vals) > 1 and all(vals) and
                     names[0] == "upstream" else " |")
            out.append(f"| {call} | {t} | " + " | ".join(cells) + " |" + ratio)
    out += ["", "batch_put_from / batch_get_into with registered buffers (ops/s, GB/s):", "",
            "| block x batch | op | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names)]
    cases = []
    for n in names:
        for r in results[n]["data"]:
            if (r["block"], r["batch"]) not in cases:
                cases.append((r["block"], r["batch"]))
    for block, batch in cases:
        for op in ("put", "get"):
            cells = []
            for n in names:
                r = [x for x in results[n]["data"] if (x["block"], x["batch"]) == (block, batch)]
                cells.append(f"{r[0][op]['ops_per_s']:,.0f} ({r[0][op]['gbps']:.2f})" if r
                             else "—")
            size = f"{block >> 20} MiB" if block >= MIB else f"{block >> 10} KiB"
            out.append(f"| {size} x {batch} | {op} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", choices=["holder", "client", "pair"])
    ap.add_argument("--master", help="holder / client: the master's host:port; "
                    "pair: the mooncake_master binary")
    ap.add_argument("--metadata", help="the metadata server URL (holder / client)")
    ap.add_argument("--python", default=sys.executable, help="pair: the python to run")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--protocol", default="tcp")
    ap.add_argument("--segment", type=int, default=1 << 30, help="the holder's segment bytes")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per data figure")
    ap.add_argument("--meta_calls", type=int, default=3000, help="calls per thread")
    ap.add_argument("--threads", default="1,8", help="meta: client thread counts")
    ap.add_argument("--cases", default="4096x128,65536x64,1048576x16",
                    help="BLOCKxBATCH,... for the data figures")
    ap.add_argument("--skip", default="", help="meta,data: parts not to run")
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",") if t]
    args.cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",") if c]
    skip = set(args.skip.split(","))
    if args.role == "pair":
        extra = [a for a in sys.argv[2:]]
        drop = {"--master", "--python", "--protocol"}
        rest, i = [], 0
        while i < len(extra):
            if extra[i] in drop:
                i += 2
                continue
            rest.append(extra[i])
            i += 1
        print(json.dumps(run_pair(args.python, args.master, args.protocol, rest)))
        return

    if args.role == "holder":
        store = make_store(args, args.segment)
        print("holder ready", flush=True)
        sys.stdin.read()
        store.close()
        return
    store = make_store(args, 0)
    buf_size = max(b * n for b, n in args.cases) if args.cases else MIB
    buf = ctypes.create_string_buffer(buf_size)
    addr = ctypes.addressof(buf)
    if store.register_buffer(addr, buf_size) != 0:
        sys.exit("register_buffer failed")
    result = {"meta": [] if "meta" in skip else meta(store, args),
              "data": [] if "data" in skip else data(store, args, addr, buf_size)}
    store.unregister_buffer(addr)
    print(json.dumps(result), flush=True)
    store.close()
    os._exit(0)


if __name__ == "__main__":
    main()
