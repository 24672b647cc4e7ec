#!/usr/bin/env python3
"""The benchmark harness: this engine beside the physical limits of this machine, and beside
upstream Mooncake, measured in one run.

For each block size (4 KiB, 64 KiB, 1 MiB, 16 MiB), operation (read, write) and thread count
(1, 2) it runs, several times each:
  - raw baselines (bench/raw_baselines): a TCP loopback stream with as many connections as
    threads, memcpy, process_vm_writev between two processes;
  - this engine through tools/transfer_engine_bench (T threads, T TCP streams per peer);
  - upstream's engine through the transfer_engine_bench its PyPI wheel ships (same flags,
    MC_TCP_LANES_PER_PEER=T), when the wheel can be installed.
Then the Store (src/store): mooncake_master, a holder client contributing the pool and
tools/store_bench putting / getting 4 KiB and 1 MiB objects in batches, beside the engine's own
figure for the same block and batch (transfer_engine_bench, auto transport: same host -> shm);
the Store's first fill of a fresh holder's segment beside a warm fill (store_bench --fills=2,
4 KiB / 64 KiB / 1 MiB; same host, and over TCP in the full run); and the Store beside upstream's through the Python API both packages share
(bench/store_compare.py: single-key master calls from 1 and 8 threads, batch puts and gets).
It reports each figure as the median of the runs with min and max, writes a Markdown table,
a JSON file and a PNG plot under bench/results/<date>-<commit>/, and prints the table.

  bench/run.py --quick        # under 2 minutes; what CI runs as a smoke test
  bench/run.py                # the full run
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

from ucx_bench import run_ucx

REPO = pathlib.Path(__file__).resolve().parent.parent
KIB, MIB = 1024, 1024 * 1024
BLOCKS = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB]
BATCH = {4 * KIB: 128, 64 * KIB: 128, 1 * MIB: 16, 16 * MIB: 4}
TARGET_BUFFER = 1 << 30


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def machine():
    cpu = "unknown cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, Linux {platform.release()}"


def commit():
    try:
        return subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       text=True).strip()
    except Exception:
        return "unknown"


class Target:
    """A transfer_engine_bench target process; `segment` is its name."""

    def __init__(self, binary, env=None, ours=True, lend=False):
        self.log = open(f"/tmp/bench-target-{os.getpid()}-{id(self)}.log", "w+")
        args = [binary, "--mode=target", "--metadata_server=P2PHANDSHAKE",
                "--local_server_name=127.0.0.1", f"--buffer_size={TARGET_BUFFER}"]
        if not ours:
            args.append("--protocol=tcp")
        if lend:
            args.append("--shared_buffer")  # a memfd the initiator maps and copies into
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        ready = "Target segment name" if ours else "numa node num"
        deadline = time.time() + 60
        self.segment = None
        while time.time() < deadline and self.proc.poll() is None:
            text = open(self.log.name).read()
            m = re.search(r"listening on (\S+)", text)
            if m and ready in text:
                self.segment = m.group(1)
                time.sleep(0.2)
                return
            time.sleep(0.1)
        raise RuntimeError(f"target {binary} did not start:\n{open(self.log.name).read()[-2000:]}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def run_engine(binary, segment, op, block, threads, duration, ours, env, protocol="tcp",
               shared=False):
    batch = BATCH[block]
    buffer = max(block * batch * threads, 64 * MIB)
    args = [binary, "--mode=initiator", "--metadata_server=P2PHANDSHAKE",
            "--local_server_name=127.0.0.1", f"--segment_id={segment}", f"--operation={op}",
            f"--block_size={block}", f"--batch_size={batch}", f"--threads={threads}",
            f"--duration={duration}", f"--buffer_size={buffer}"]
    if ours:
        args += ["--json", f"--protocol={protocol}"]
        if shared:
            args.append("--shared_buffer")
    else:
        args.append("--protocol=tcp")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=duration + 120, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{'ours' if ours else 'upstream'} {protocol} {op} {block}x{threads}: exit "
                           f"{proc.returncode}\n{out[-1500:]}")
    if ours:
        line = [l for l in proc.stdout.splitlines() if l.startswith("{")][-1]
        r = json.loads(line)
        return {"gbps": r["gbps"], "ops": r["ops_per_s"], "p50": r["batch_p50_us"],
                "p99": r["batch_p99_us"]}
    m = re.search(r"Test completed: duration ([\d.]+), batch count (\d+), throughput ([\d.]+) GB/s",
                  out)
    if not m:
        raise RuntimeError(f"upstream: no result line\n{out[-1500:]}")
    secs, batches, gbps = float(m.group(1)), int(m.group(2)), float(m.group(3))
    return {"gbps": gbps, "ops": batches * batch / secs, "p50": None, "p99": None}


STORE_CASES = [(4 * KIB, 128), (1 * MIB, 16)]


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_store(build, runs, duration):
    """Store put/get figures beside the engine's write/read for the same block and batch."""
    master_bin = build / "src" / "store" / "mooncake_master"
    bench_bin = build / "tools" / "store_bench"
    engine_bin = build / "tools" / "transfer_engine_bench"
    for b in (master_bin, bench_bin):
        if not b.exists():
            log(f"{b} is missing: store figures skipped")
            return []
    port = free_port()
    addr = f"127.0.0.1:{port}"
    procs = [subprocess.Popen([str(master_bin), f"--rpc_port={port}",
                               f"--metrics_port={free_port()}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    rows = []
    target = None
    try:
        time.sleep(0.3)
        holder = subprocess.Popen([str(bench_bin), "--role=holder", f"--master={addr}",
                                   "--segment_size=1073741824"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        procs.append(holder)
        line = holder.stdout.readline()
        if "holder ready" not in line:
            raise RuntimeError("store holder did not start")
        env = dict(os.environ, MC_TCP_LANES_PER_PEER="1", MC_SHM_STREAMS_PER_PEER="1")
        target = Target(str(engine_bin), env)
        for block, batch in STORE_CASES:
            for op, engine_op in (("put", "write"), ("get", "read")):
                figures = []
                for _ in range(runs):
                    out = subprocess.run(
                        [str(bench_bin), "--role=bench", f"--master={addr}", f"--op={op}",
                         f"--block_size={block}", f"--batch_size={batch}",
                         f"--duration={duration}", "--json"],
                        capture_output=True, text=True, timeout=duration + 120)
                    if out.returncode != 0:
                        raise RuntimeError(f"store_bench {op} {block}: {out.stderr[-1500:]}")
                    r = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
                    figures.append({"gbps": r["gbps"], "ops": r["ops_per_s"],
                                    "p50": r["batch_p50_us"], "p99": r["batch_p99_us"]})
                saved = BATCH[block]
                BATCH[block] = batch
                try:
                    engine = summarize([run_engine(str(engine_bin), target.segment, engine_op,
                                                   block, 1, duration, True, env, "auto")
                                        for _ in range(runs)])
                finally:
                    BATCH[block] = saved
                row = {"op": op, "block": block, "batch": batch, "store": summarize(figures),
                       "engine": engine}
                rows.append(row)
                log(f"store {op} {human(block)}: {fmt(row['store'])} GB/s, "
                    f"{row['store']['ops']:.0f} ops/s; engine {engine_op} {fmt(engine)} GB/s")
    finally:
        if target:
            target.stop()
        stop_all(procs)
    return rows


def stop_all(procs):
    """SIGTERM in reverse order of start, SIGKILL for whoever has not left after 10 s."""
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


FILL_CASES = [(4 * KIB, 128), (64 * KIB, 64), (1 * MIB, 16)]


def run_first_fill(build, transports):
    """Store puts into a fresh holder's segment (first fill) and again once it was emptied
    (warm), in one client process: store_bench --fills=2 over a working set of 768 MiB of a
    1 GiB segment, a fresh master and holder per case (issue 33)."""
    master_bin = build / "src" / "store" / "mooncake_master"
    bench_bin = build / "tools" / "store_bench"
    if not master_bin.exists() or not bench_bin.exists():
        log("store_bench or mooncake_master missing: first-fill figures skipped")
        return []
    rows = []
    for transport in transports:
        env = dict(os.environ)
        if transport == "tcp":
            env["MC_FORCE_TCP"] = "1"
        for block, batch in FILL_CASES:
            port = free_port()
            addr = f"127.0.0.1:{port}"
            procs = [subprocess.Popen([str(master_bin), f"--rpc_port={port}",
                                       f"--metrics_port={free_port()}"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
            try:
                time.sleep(0.3)
                holder = subprocess.Popen([str(bench_bin), "--role=holder", f"--master={addr}",
                                           "--segment_size=1073741824"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True)
                procs.append(holder)
                if "holder ready" not in holder.stdout.readline():
                    raise RuntimeError("store holder did not start")
                out = subprocess.run(
                    [str(bench_bin), "--role=bench", f"--master={addr}", "--op=put",
                     f"--block_size={block}", f"--batch_size={batch}", "--fills=2",
                     f"--working_set={768 * MIB}", "--json"],
                    capture_output=True, text=True, timeout=300, env=env)
                if out.returncode != 0:
                    raise RuntimeError(f"store_bench fills {block}: {out.stderr[-1500:]}")
                fills = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
                first, warm = fills[0], fills[-1]
                rows.append({"transport": transport, "block": block, "batch": batch,
                             "first_ops": first["ops_per_s"], "first_gbps": first["gbps"],
                             "warm_ops": warm["ops_per_s"], "warm_gbps": warm["gbps"]})
                log(f"store first fill {transport} {human(block)}: {first['ops_per_s']:.0f} ops/s, "
                    f"warm {warm['ops_per_s']:.0f} ops/s")
            except (RuntimeError, subprocess.TimeoutExpired, IndexError, ValueError) as e:
                log(f"first-fill run failed: {e}")
            finally:
                stop_all(procs)
    return rows


def first_fill_table(rows):
    out = ["| transport | block | batch | first fill ops/s (GB/s) | warm ops/s (GB/s) | first / warm |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['transport']} | {human(r['block'])} | {r['batch']} | "
                   f"{r['first_ops']:.0f} ({r['first_gbps']:.2f}) | {r['warm_ops']:.0f} "
                   f"({r['warm_gbps']:.2f}) | {r['first_ops'] / r['warm_ops']:.2f} |")
    return "\n".join(out)


def store_table(rows):
    out = ["| op | block | batch | store GB/s (min-max) | store ops/s | batch p50 / p99 us | "
           "engine GB/s (same block, batch) | store / engine |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, e = r["store"], r["engine"]
        ratio = s["gbps"] / e["gbps"] if e["gbps"] else 0
        out.append(f"| {r['op']} | {human(r['block'])} | {r['batch']} | {fmt(s)} | "
                   f"{s['ops']:.0f} | {s['p50']:.0f} / {s['p99']:.0f} | {fmt(e)} | "
                   f"{ratio * 100:.0f}% |")
    return "\n".join(out)


def run_baseline(binary, kind, block, threads, duration):
    # The same working set per thread as the engine runs (a batch of blocks), same caches.
    span = block * BATCH[block]
    proc = subprocess.run([binary, kind, "--block_size", str(block), "--threads", str(threads),
                           "--duration", str(duration), "--span", str(span)],
                          capture_output=True, text=True,
                          timeout=duration + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"baseline {kind}: {proc.stderr[-500:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"gbps": r["gbps"], "ops": r["ops_per_s"]}


def summarize(runs):
    vals = [r["gbps"] for r in runs]
    out = {"gbps": statistics.median(vals), "min": min(vals), "max": max(vals),
           "ops": statistics.median(r["ops"] for r in runs)}
    for k in ("p50", "p99"):
        xs = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(xs) if xs else None
    return out


def upstream_bench():
    venv = REPO / "build" / "upstream-venv"
    setup = REPO / "tests" / "interop" / "setup_upstream_venv.sh"
    proc = subprocess.run([str(setup), str(venv)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        log("upstream wheel unavailable; upstream column left empty: " + proc.stderr[-300:])
        return None
    found = list(venv.glob("lib/python3*/site-packages/mooncake/transfer_engine_bench"))
    return str(found[0]) if found else None


def fmt(s):
    return f"{s['gbps']:.2f} [{s['min']:.2f}–{s['max']:.2f}]"


def human(block):
    return f"{block // MIB} MiB" if block >= MIB else f"{block // KIB} KiB"


def table(results, upstream_on):
    lines = ["| transport | op | block | threads | engine GB/s (median [min–max]) | engine req/s | "
             "batch p50 / p99 µs | baseline | baseline GB/s | engine / baseline | "
             "upstream GB/s | upstream / baseline |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        e, base, up = r["engine"], r["baseline"], r.get("upstream")
        if r["transport"] == "tcp":
            up_s = fmt(up) if up else ("n/a" if upstream_on else "not run")
            up_ratio = f"{up['gbps'] / base['gbps']:.0%}" if up else "—"
        else:
            up_s, up_ratio = "no such path", "—"
        lat = f"{e['p50']:.0f} / {e['p99']:.0f}" if e.get("p50") is not None else "—"
        lines.append(f"| {r['transport']} | {r['op']} | {human(r['block'])} | {r['threads']} | "
                     f"{fmt(e)} | {e['ops']:,.0f} | {lat} | {r['baseline_kind']} | {fmt(base)} | "
                     f"{e['gbps'] / base['gbps']:.0%} | {up_s} | {up_ratio} |")
    return "\n".join(lines)


def baseline_table(baselines):
    lines = ["| baseline | block | threads | GB/s (median [min–max]) |", "|---|---|---|---|"]
    for (kind, block, threads), s in sorted(baselines.items()):
        lines.append(f"| {kind} | {human(block)} | {threads} | {fmt(s)} |")
    return "\n".join(lines)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(4, 2, figsize=(12, 14), sharey="row")
    for row, transport in enumerate(("tcp", "shm", "shm+shared", "shm+lent")):
        for col, threads in enumerate((1, 2)):
            ax = axes[row][col]
            sel = [r for r in results if r["transport"] == transport and r["threads"] == threads]
            for op, style in (("write", "-"), ("read", "--")):
                rows = [r for r in sel if r["op"] == op]
                xs = [r["block"] for r in rows]
                ax.plot(xs, [r["engine"]["gbps"] for r in rows], "o" + style,
                        label=f"engine {op}")
                if any(r.get("upstream") for r in rows):
                    ax.plot(xs, [r["upstream"]["gbps"] if r.get("upstream") else float("nan")
                                 for r in rows], "s" + style, label=f"upstream {op}")
            rows = [r for r in sel if r["op"] == "write"]
            if rows:
                ax.plot([r["block"] for r in rows], [r["baseline"]["gbps"] for r in rows], "k^:",
                        label=f"raw {rows[0]['baseline_kind']}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(BLOCKS, [human(b) for b in BLOCKS])
            ax.set_title(f"{transport}: {threads} thread(s) / stream(s)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        axes[row][0].set_ylabel("GB/s")
    for ax in axes[3]:
        ax.set_xlabel("block size")
    fig.suptitle("Engine vs raw baselines (and upstream over TCP), one machine, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (under 2 minutes)")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--runs", type=int, help="runs per figure (default 3 quick, 5 full)")
    ap.add_argument("--duration", type=float, help="seconds per run (default 0.3 quick, 3 full)")
    ap.add_argument("--no-upstream", action="store_true")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 5)
    up_runs = 1 if args.quick and not args.runs else runs
    duration = args.duration or (0.3 if args.quick else 3)
    engine_dur = duration
    build = pathlib.Path(args.build)
    ours_bin = build / "tools" / "transfer_engine_bench"
    raw_bin = build / "bench" / "raw_baselines"
    for b in (ours_bin, raw_bin):
        if not b.exists():
            sys.exit(f"{b} is missing: build first (make build)")
    up_bin = None if args.no_upstream else upstream_bench()

    started = time.time()
    results, baselines = [], {}
    for threads in (1, 2):
        env = dict(os.environ, MC_TCP_LANES_PER_PEER=str(threads),
                   MC_SHM_STREAMS_PER_PEER=str(threads))
        ours_t = Target(str(ours_bin), env)
        lent_t = Target(str(ours_bin), env, lend=True)
        up_t = Target(up_bin, env, ours=False) if up_bin else None
        try:
            for block in BLOCKS:
                for transport, kind in (("tcp", "tcp"), ("shm", "pvm"), ("shm+shared", "memcpy"),
                                        ("shm+lent", "memcpy")):
                    if (kind, block, threads) not in baselines:
                        baselines[(kind, block, threads)] = summarize(
                            [run_baseline(str(raw_bin), kind, block, threads, duration / 2)
                             for _ in range(runs)])
                    for op in ("write", "read"):
                        row = {"transport": transport, "op": op, "block": block,
                               "threads": threads, "baseline_kind": kind,
                               "baseline": baselines[(kind, block, threads)]}
                        target = lent_t if transport == "shm+lent" else ours_t
                        row["engine"] = summarize([
                            run_engine(str(ours_bin), target.segment, op, block, threads,
                                       duration, True, env, transport.split("+")[0],
                                       shared=transport.endswith("+shared"))
                            for _ in range(runs)])
                        if up_t and transport == "tcp":
                            try:
                                row["upstream"] = summarize([
                                    run_engine(up_bin, up_t.segment, op, block, threads,
                                               max(1, round(duration)), False, env)
                                    for _ in range(up_runs)])
                            except RuntimeError as e:
                                log(f"upstream run failed: {e}")
                        results.append(row)
                        log(f"{transport} {op} {human(block)} x{threads}: engine "
                            f"{fmt(row['engine'])} GB/s, raw {kind} {fmt(row['baseline'])}")
        finally:
            ours_t.stop()
            lent_t.stop()
            if up_t:
                up_t.stop()
    store_rows = run_store(build, runs, max(duration, 0.5))
    fill_rows = run_first_fill(build, ["shm"] if args.quick else ["shm", "tcp"])
    sys.path.insert(0, str(REPO / "bench"))
    import store_compare
    compare_results, compare_md = store_compare.compare(REPO, build, args.quick, log)
    scale_results, scale_md = store_compare.scale(REPO, build, args.quick, log)
    elapsed = time.time() - started

    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    out = pathlib.Path(args.out) / f"{stamp}-{commit()}{'-quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    header = (f"# Benchmark {'(quick) ' if args.quick else ''}{stamp}, commit {commit()}\n\n"
              f"Machine: {machine()}.\n\nCommand: `bench/run.py{' --quick' if args.quick else ''}`"
              f" ({runs} runs per figure ({up_runs} for upstream), {engine_dur} s engine runs, {duration / 2:g} s baseline"
              f" runs; took {elapsed:.0f} s). 127.0.0.1, P2PHANDSHAKE; T threads use T streams; tcp rows "
              f"compare with a raw TCP loopback stream of T connections, shm rows with raw "
              f"process_vm_writev on T threads, shm+shared rows (initiator memory from "
              f"AllocateSharedMemory, mapped by the target, which copies) and shm+lent rows (the "
              f"target's memory from AllocateSharedMemory, mapped by the initiator, whose "
              f"submitting threads copy) with memcpy on T threads; baselines "
              f"cycle through the same working set as the engine (one batch of blocks per "
              f"thread); "
              f"batch sizes {', '.join(f'{human(b)}: {n}' for b, n in BATCH.items())}.\n")
    md = (header + "\n## Engine vs raw baselines and upstream\n\n" + table(results, bool(up_bin)) +
          "\n\n## Raw baselines\n\n" + baseline_table(baselines) + "\n")
    if store_rows:
        md += ("\n## Store (mooncake_master + 2 clients, 1 thread, registered buffers)\n\n" +
               store_table(store_rows) + "\n")
    if fill_rows:
        md += ("\n## Store first fill vs warm (a fresh holder lending 1 GiB; one client process "
               "puts 768 MiB into it, empties it, puts 768 MiB again: store_bench --fills=2; "
               "shm = same host)\n\n" + first_fill_table(fill_rows) + "\n")
    md += ("\n## Store beside upstream's (the Python API, one run each; master with its HTTP "
           "metadata server, a holder lending 1 GiB, a client lending nothing, 127.0.0.1)\n\n" +
           compare_md + "\n## Store scale (the master in process; many client processes)\n\n" +
           scale_md)
    md += run_ucx(build, 1 if args.quick else runs, max(duration, 0.5))[1]  # bench/ucx_bench.py
    has_plot = plot(results, out / "throughput.png")
    if has_plot:
        md += "\n![throughput](throughput.png)\n"
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps(
        {"machine": machine(), "commit": commit(), "date": stamp, "quick": args.quick,
         "results": results, "store": store_rows, "store_first_fill": fill_rows,
         "store_compare": compare_results,
         "store_scale": scale_results,
         "baselines": [{"kind": k[0], "block": k[1], "threads": k[2], **v}
                       for k, v in baselines.items()]}, indent=1))
    print(md)
    log(f"wrote {out}/results.md" + (" and throughput.png" if has_plot else ""))


if __name__ == "__main__":
    main()
