#!/usr/bin/env python3
"""The UCX transport beside ucx_perftest (ucx-utils) on the same UCX lanes, in one run.

For each lane (UCX_TLS=tcp, UCX_TLS=sm,self), operation (put = engine write, get = engine
read) and block size (4 KiB, 64 KiB, 1 MiB, 16 MiB) it runs, several times each:
  - ucx_perftest's one-sided test (ucp_put_bw / ucp_get) between two processes on
    127.0.0.1, one message of the block size per iteration;
  - tools/transfer_engine_bench --protocol=ucx, one thread, batches as bench/run.py uses.
Both report bytes per second (ucx_perftest's MB/s are MiB/s, converted here to GB/s = 1e9
bytes/s) and messages per second; the ratio column is engine / ucx_perftest (medians).

  bench/ucx_bench.py [--build build] [--runs 3] [--duration 1]   # standalone, prints the table
  run_ucx(build, runs, duration) -> (rows, markdown)           # what bench/run.py calls
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
KIB, MIB = 1024, 1024 * 1024
BLOCKS = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB]
BATCH = {4 * KIB: 128, 64 * KIB: 128, 1 * MIB: 16, 16 * MIB: 4}
LANES = [("tcp", "tcp"), ("sm", "sm,self")]
OPS = [("put", "write", "ucp_put_bw"), ("get", "read", "ucp_get")]
TARGET_BUFFER = 256 * MIB


def log(msg):
    print(f"[ucx-bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest_once(test, block, iters, window, env, timeout):
    port = free_port()
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # the server needs a moment to listen
            time.sleep(0.1)
            started = time.time()
            proc = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test,
                                   "-s", str(block), "-n", str(iters), "-w",
                                   str(max(100, iters // 10)), "-O", str(window), "-f", "-v"],
                                  capture_output=True, text=True, env=env, timeout=timeout)
            if proc.returncode == 0:
                lines = [l.strip() for l in proc.stdout.splitlines() if re.match(r"^\s*\d", l)]
                # iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,
                # avg_mr,overall_mr
                cols = lines[-1].split(",")
                return {"gbps": float(cols[5]) * MIB / 1e9, "ops": float(cols[7]),
                        "wall": time.time() - started}
        raise RuntimeError(f"ucx_perftest {test} {block}: {proc.stdout[-300:]} "
                           f"{proc.stderr[-300:]}")
    finally:
        if server.poll() is None:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def perftest(test, block, duration, env):
    """One ucx_perftest run (server and client on 127.0.0.1) of about `duration` seconds, with
    as many operations outstanding (-O) as the engine's batch; returns GB/s and msgs/s."""
    window = BATCH[block]
    # The probe's own rate (not its wall time, which start-up dominates) sizes the run.
    probe = perftest_once(test, block, 8 * window, window, env, 120)
    iters = max(8 * window, min(2_000_000, int(duration * max(probe["ops"], 1.0))))
    return perftest_once(test, block, iters, window, env, duration * 20 + 120)


class Target:
    def __init__(self, binary, env):
        self.log = open(f"/tmp/ucx-bench-target-{os.getpid()}-{id(self)}.log", "w+")
        self.proc = subprocess.Popen(
            [binary, "--mode=target", "--metadata_server=P2PHANDSHAKE",
             "--local_server_name=127.0.0.1", f"--buffer_size={TARGET_BUFFER}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        self.segment = None
        while time.time() < deadline and self.proc.poll() is None:
            text = open(self.log.name).read()
            m = re.search(r"listening on (\S+)", text)
            if m and "Target segment name" in text:
                self.segment = m.group(1)
                return
            time.sleep(0.1)
        raise RuntimeError(f"target did not start:\n{open(self.log.name).read()[-2000:]}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def engine(binary, segment, op, block, duration, env):
    batch = BATCH[block]
    args = [binary, "--mode=initiator", "--metadata_server=P2PHANDSHAKE",
            "--local_server_name=127.0.0.1", f"--segment_id={segment}", f"--operation={op}",
            f"--block_size={block}", f"--batch_size={batch}", "--threads=1",
            f"--duration={duration}", f"--buffer_size={max(block * batch, 64 * MIB)}",
            "--protocol=ucx", "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=duration + 120, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"engine ucx {op} {block}: exit {proc.returncode}\n"
                           f"{(proc.stdout + proc.stderr)[-1500:]}")
    r = json.loads([l for l in proc.stdout.splitlines() if l.startswith("{")][-1])
    return {"gbps": r["gbps"], "ops": r["ops_per_s"]}


def summarize(runs):
    vals = [r["gbps"] for r in runs]
    return {"gbps": statistics.median(vals), "min": min(vals), "max": max(vals),
            "ops": statistics.median(r["ops"] for r in runs)}


def human(block):
    return f"{block // MIB} MiB" if block >= MIB else f"{block // KIB} KiB"


def markdown(rows):
    out = ["| UCX_TLS | op | block | engine GB/s [min–max] | ucx_perftest GB/s [min–max] | "
           "ratio | engine msgs/s | ucx_perftest msgs/s | ucx_perftest, UCX-allocated "
           "buffers, GB/s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e, p, o = r["engine"], r["perftest"], r["perftest_ucx_alloc"]
        out.append(f"| {r['tls']} | {r['op']} | {human(r['block'])} | {e['gbps']:.2f} "
                   f"[{e['min']:.2f}–{e['max']:.2f}] | {p['gbps']:.2f} "
                   f"[{p['min']:.2f}–{p['max']:.2f}] | {r['ratio']:.2f} | {e['ops']:.0f} | "
                   f"{p['ops']:.0f} | {o['gbps']:.2f} [{o['min']:.2f}–{o['max']:.2f}] |")
    return "\n".join(out)


def run_ucx(build, runs, duration):
    """Returns (rows, markdown); ([], "") with a log line where UCX or ucx_perftest is absent."""
    binary = pathlib.Path(build) / "tools" / "transfer_engine_bench"
    if not shutil.which("ucx_perftest"):
        log("ucx_perftest not found (apt-get install ucx-utils): UCX rows skipped")
        return [], ""
    if not binary.exists():
        log(f"{binary} is missing: UCX rows skipped")
        return [], ""
    rows = []
    for lane, tls in LANES:
        env = dict(os.environ, UCX_TLS=tls)
        try:
            target = Target(str(binary), env)
        except RuntimeError as e:
            log(f"UCX_TLS={tls}: {e}")
            continue
        try:
            for block in BLOCKS:
                for name, op, test in OPS:
                    eng = summarize([engine(str(binary), target.segment, op, block, duration, env)
                                     for _ in range(runs)])
                    # Like for like: ucx_perftest's buffers from the heap, as the engine's are
                    # user memory; UCX's own allocation (shared memory on sm lanes, which
                    # peers map and copy into directly) is shown beside it.
                    heap_env = dict(env, UCX_ALLOC_PRIO="heap")
                    ref = summarize([perftest(test, block, duration, heap_env)
                                     for _ in range(runs)])
                    own = summarize([perftest(test, block, duration, env) for _ in range(runs)])
                    row = {"lane": lane, "tls": tls, "op": name, "block": block, "engine": eng,
                           "perftest": ref, "perftest_ucx_alloc": own,
                           "ratio": eng["gbps"] / ref["gbps"] if ref["gbps"] else 0}
                    rows.append(row)
                    log(f"UCX_TLS={tls} {name} {human(block)}: engine {eng['gbps']:.2f} GB/s, "
                        f"ucx_perftest {ref['gbps']:.2f} GB/s, ratio {row['ratio']:.2f}")
        finally:
            target.stop()
    md = ("\n## UCX transport vs ucx_perftest (same lanes, same run)\n\n"
          "One-sided put (engine write) and get (engine read) between two processes on "
          "127.0.0.1; the engine: transfer_engine_bench --protocol=ucx, 1 thread, batches "
          f"{', '.join(f'{human(b)}: {n}' for b, n in BATCH.items())}; ucx_perftest: "
          "ucp_put_bw / ucp_get, one message per iteration, as many outstanding (-O) as the "
          "engine's batch, buffers from the heap (UCX_ALLOC_PRIO=heap: user memory, as the "
          "engine's registered buffers; the ratio is against this) and, in the last column, "
          "from UCX's own allocator (on sm lanes shared memory the peer maps and copies into "
          "with memcpy instead of cma's process_vm_writev); medians of "
          f"{runs} runs of about {duration} s.\n\n" + markdown(rows) + "\n") if rows else ""
    return rows, md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rows, md = run_ucx(args.build, args.runs, args.duration)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(md)


if __name__ == "__main__":
    main()
