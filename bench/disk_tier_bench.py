#!/usr/bin/env python3
"""The disk tier beside the disk itself (src/store/disk/README.md), in one run.

Starts mooncake_master --enable_offload (free ports), a holder process that lends --segment
bytes of DRAM and offloads to --dir, and uses this process as a client lending nothing:

  1. the directory's own speed with dd: sequential write of --dd-mib MiB then fdatasync
     (what a bucket write does), and a cold sequential read (page cache dropped), each
     through the page cache and with O_DIRECT; the ratios are against the faster of the two;
  2. how soon a single put into an idle holder is on its disk (its offload recorded at the
     master), 8 times 0.6 s apart, p50 and max in ms;
     per object size: puts of --fill x the segment in batches of --batch from registered
     memory (a put answered -200, the pool full of objects still waiting for the disk, is
     retried), and the offload rate: bytes the master recorded on disk over the time from the
     first put to the last record;
  3. gets of disk-resident objects in batches of --batch (page cache dropped first), against
     dd's read rate, and against dd with O_DIRECT over the tier's own bucket files right
     after (the same bytes where they lie: this VM's disk drifts by a third within minutes);
     the offload also against a dd with O_DIRECT just before and after it; p50 / p99 of single gets of 4 KiB and 1 MiB disk-resident objects (cold, the disk
     otherwise idle: after the offload of the objects that pushed them out of memory);
  4. DRAM hits with the tier on against a holder without it (same objects, same master;
     four alternating rounds, the medians);
  5. a restart of the holder on the same directory (after step 2's objects): setup time
     against what its scan found.

  build/py-venv/bin/python bench/disk_tier_bench.py --segment 134217728 --fill 4
  build/py-venv/bin/python bench/disk_tier_bench.py --segment 1073741824 --fill 10 \
      --sizes 1048576 --restart-only     # a restart of a holder with 10 GiB on its disk
  MC_FORCE_TCP=1 build/py-venv/bin/python bench/disk_tier_bench.py   # the bytes over TCP

Needs root for dropping the page cache (else the read figures say "warm"). The python
running it must import our `mooncake` (MC_PY_INSTALL_ONLY=1 scripts/python_test.sh).
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIB = 1 << 20


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd(args):
    """The directory's sequential write (+fdatasync) and cold read, in GB/s: through the page
    cache and with O_DIRECT (4 MiB blocks), each; the ratios are taken against the faster."""
    path = os.path.join(args.dir, "dd.bench")
    n = args.dd_mib
    out = {}
    for name, wflags, rflags, bs in (("buffered", [], [], "1M"),
                                     ("direct", ["oflag=direct"], ["iflag=direct"], "4M")):
        count = n // 4 if bs == "4M" else n
        t = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", f"count={count}",
                        "conv=fdatasync"] + wflags, check=True, capture_output=True)
        out[f"dd_write_{name}_gbps"] = round(n * MIB / (time.perf_counter() - t) / 1e9, 3)
        cold = drop_caches()
        t = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", f"bs={bs}"] + rflags, check=True,
                       capture_output=True)
        out[f"dd_read_{name}_gbps"] = round(n * MIB / (time.perf_counter() - t) / 1e9, 3)
        os.unlink(path)
    w = max(out["dd_write_buffered_gbps"], out["dd_write_direct_gbps"])
    r = max(out["dd_read_buffered_gbps"], out["dd_read_direct_gbps"])
    return w, r, cold, out


def dd_write_now(args):
    """dd with O_DIRECT right now: 256 MiB written in 4 MiB blocks (+fdatasync), in GB/s.
    Taken just before and after each offload phase, since this VM's disk drifts by a third
    within minutes (dd() at the start can see another state of the device)."""
    path = os.path.join(args.dir, "dd.adjacent")
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", "count=64", "conv=fdatasync",
                    "oflag=direct"], check=True, capture_output=True)
    gbps = 256 * MIB / (time.perf_counter() - t) / 1e9
    os.unlink(path)
    return gbps


def dd_buckets_now(args):
    """dd with O_DIRECT (4 MiB blocks) over the tier's own bucket files, cold, in GB/s: the
    very bytes the gets read, where they lie, right after the gets (a small file dd just
    wrote reads faster here: the VM's host still caches it)."""
    files = sorted(str(p) for p in pathlib.Path(args.dir).glob("*.bucket"))
    drop_caches()
    total = sum(os.path.getsize(f) for f in files)
    t = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=4M", "iflag=direct"], check=True,
                       capture_output=True)
    return total / (time.perf_counter() - t) / 1e9


class Holder:
    """A store in a child process lending `segment` bytes (offloading to `path` if given)."""

    def __init__(self, master, segment, path):
        code = (
            "import sys, time\n"
            "from mooncake.store import MooncakeDistributedStore\n"
            "s = MooncakeDistributedStore()\n"
            f"t = time.perf_counter()\n"
            f"rc = s.setup('127.0.0.1', 'P2PHANDSHAKE', {segment}, 16 << 20, 'tcp', '', "
            f"'{master}', enable_ssd_offload={bool(path)}, ssd_offload_path='{path or ''}')\n"
            "print(rc, time.perf_counter() - t, s.get_hostname(), flush=True)\n"
            "sys.stdin.read()\n"
            "s.close()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        rc, self.setup_s, self.name = self.proc.stdout.readline().split()
        assert rc == "0", rc
        self.setup_s = float(self.setup_s)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(60)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        m = re.search(rf"^{re.escape(name)} (\d+)", r.read().decode(), re.M)
    return int(m.group(1)) if m else 0


def put_to_disk_ms(s, http, rounds=8):
    """A 4 KiB put into the idle holder, then how long until the master records it on the
    holder's disk (its offload worker's fetch, the bucket write, the report): p50 and max."""
    times = []
    assert s.put("idle-warm", b"x" * 4096) == 0  # the first put also connects to the holder
    for i in range(rounds):
        time.sleep(0.6)  # idle: past a worker's half second of quick polls after work
        before = metric(http, "master_offload_recorded_total")
        t = time.perf_counter()
        assert s.put(f"idle-{i}", b"x" * 4096) == 0
        while metric(http, "master_offload_recorded_total") <= before:
            if time.perf_counter() - t > 10:
                sys.exit("a put into the idle holder was not offloaded within 10 s")
            time.sleep(0.0005)
        times.append((time.perf_counter() - t) * 1000)
    s.remove_all(True)
    return {"p50": round(pct(times, 50), 1), "max": round(max(times), 1)}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/mc-disk-bench")
    ap.add_argument("--segment", type=int, default=128 * MIB)
    ap.add_argument("--fill", type=int, default=4)
    ap.add_argument("--sizes", default="1048576,65536")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dd-mib", type=int, default=1024)
    ap.add_argument("--latency-gets", type=int, default=200)
    ap.add_argument("--master", default=str(ROOT / "build" / "src" / "store" / "mooncake_master"),
                    help="the mooncake_master binary (another build's, for an A/B)")
    ap.add_argument("--restart-only", action="store_true",
                    help="stop after the restart (no single-get latencies, no DRAM hits): "
                         "for restarts of a large fill, e.g. --segment 1073741824 --fill 10")
    args = ap.parse_args()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    out = {"dir": args.dir, "segment": args.segment, "fill": args.fill,
           "transport": "tcp" if os.environ.get("MC_FORCE_TCP") == "1" else "same host",
           "fsync": os.environ.get("MOONCAKE_OFFLOAD_FSYNC", "bucket")}
    out["dd_write_gbps"], out["dd_read_gbps"], cold, detail = dd(args)
    out["cold_reads"] = cold
    out["dd"] = detail

    rpc, http = free_port(), free_port()
    master_bin = pathlib.Path(args.master)
    master = subprocess.Popen([str(master_bin), f"--rpc_port={rpc}", f"--metrics_port={http}",
                               "--rpc_address=127.0.0.1", "--enable_offload",
                               "--default_kv_lease_ttl=500"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addr = f"127.0.0.1:{rpc}"
    time.sleep(0.5)
    holder = Holder(addr, args.segment, args.dir)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 64 * MIB, "tcp", "", addr) == 0
    buf = bytearray(args.batch * max(int(x) for x in args.sizes.split(",")))
    import ctypes
    base = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    assert s.register_buffer(base, len(buf)) == 0
    try:
        out["idle_put_to_disk_ms"] = put_to_disk_ms(s, http)
        for size in (int(x) for x in args.sizes.split(",")):
            n = args.fill * args.segment // size
            keys = [f"b{size}-{i}" for i in range(n)]
            value = os.urandom(size)
            before = metric(http, "master_offload_recorded_total")
            refused0 = metric(http, "master_offload_refused_total")
            # Batches from registered memory (batch_put_from), so that the writer outruns the
            # disk and the offload rate is the tier's, not a Python loop's.
            for i in range(args.batch):
                buf[i * size:(i + 1) * size] = value
            dd_write_before = dd_write_now(args)
            t0 = time.perf_counter()
            for at in range(0, n, args.batch):
                ks = keys[at:at + args.batch]
                pending = list(range(len(ks)))
                while pending:
                    rcs = s.batch_put_from([ks[j] for j in pending],
                                           [base + j * size for j in pending],
                                           [size] * len(pending))
                    assert all(rc in (0, -200) for rc in rcs), rcs[:4]
                    pending = [j for j, rc in zip(pending, rcs) if rc != 0]
                    if pending:
                        time.sleep(0.01)
            put_s = time.perf_counter() - t0
            while metric(http, "master_offload_recorded_total") - before < n:
                # A refused report: the object went (evicted, removed) before its disk write
                # was recorded, so an acknowledged put is lost. The bench fails on it.
                refused = metric(http, "master_offload_refused_total") - refused0
                if refused:
                    sys.exit(f"{size}-byte objects: the master refused {refused} offload "
                             "reports (acknowledged objects lost)")
                if time.perf_counter() - t0 > 600:
                    break
                time.sleep(0.02)
            offload_s = time.perf_counter() - t0
            recorded = metric(http, "master_offload_recorded_total") - before
            dd_write = (dd_write_before + dd_write_now(args)) / 2
            row = {"size": size, "objects": n, "bytes": n * size, "put_s": round(put_s, 2),
                   "offloaded": recorded,
                   "offload_gbps": round(recorded * size / offload_s / 1e9, 3),
                   "dd_write_direct_adjacent_gbps": round(dd_write, 3)}
            # Disk-resident: the first (fill - 1) / fill of them (memory holds the rest).
            disk_keys = keys[: n * (args.fill - 1) // args.fill]
            drop_caches()
            t = time.perf_counter()
            read = 0
            for at in range(0, len(disk_keys), args.batch):
                ks = disk_keys[at:at + args.batch]
                rcs = s.batch_get_into(ks, [base + i * size for i in range(len(ks))],
                                       [size] * len(ks))
                assert all(r == size for r in rcs), rcs[:4]
                read += size * len(ks)
            row["disk_get_gbps"] = round(read / (time.perf_counter() - t) / 1e9, 3)
            row["dd_read_buckets_gbps"] = round(dd_buckets_now(args), 3)
            assert bytes(buf[:size]) == value
            out.setdefault("sizes", []).append(row)

        # Restart on the same directory: setup time against what the scan registered.
        on_disk = sum(os.path.getsize(os.path.join(args.dir, f))
                      for f in os.listdir(args.dir) if f.endswith(".bucket"))
        holder.close()
        reg0 = metric(http, "master_offload_registered_total")
        drop_caches()  # the scan reads the buckets' indexes cold
        holder = Holder(addr, args.segment, args.dir)
        s.remove_all(force=True)
        out["restart"] = {"bytes_on_disk": on_disk, "setup_s": round(holder.setup_s, 3),
                          "registered": metric(http, "master_offload_registered_total") - reg0}

        if not args.restart_only:
            # Single gets, cold, of disk-resident 4 KiB and 1 MiB objects.
            for size in (4096, MIB):
                keys = [f"lat{size}-{i}" for i in range(args.latency_gets)]
                v = os.urandom(size)
                for k in keys:
                    while s.put(k, v) != 0:
                        time.sleep(0.01)
                filler = [f"latfill{size}-{i}" for i in range(args.fill * args.segment // MIB)]
                fv = os.urandom(MIB)
                for k in filler:  # pushes the latency objects out of memory
                    while s.put(k, fv) != 0:
                        time.sleep(0.01)
                # The filler's own offload done first: a get measured behind 8 MiB bucket
                # writes waits for the disk (p99 of 4 KiB over TCP 3.6 ms so), not for the tier.
                t_drain = time.perf_counter()
                while (metric(http, "master_offload_queued") > 0 and
                       time.perf_counter() - t_drain < 60):
                    time.sleep(0.05)
                drop_caches()
                lat = []
                for k in keys:
                    t = time.perf_counter()
                    assert s.get_into(k, base, size) == size
                    lat.append((time.perf_counter() - t) * 1e6)
                from_disk = sum(1 for k in keys[:20] if s.get_replica_desc(k) and
                                s.get_replica_desc(k)[0].is_local_disk_replica())
                out[f"single_get_{size}_us"] = {"p50": round(pct(lat, 50)), "p99": round(pct(lat, 99)),
                                               "from_disk_of_first_20": from_disk}
                s.remove_all(force=True)

            # DRAM hits, tier on (holder with a disk) against a holder without it: after the
            # offload of the objects above has ended (it would compete for the CPUs), four
            # rounds of 2 s each, the order alternating; the medians' ratio (one round moves
            # by +-10 % on this VM over TCP).
            while metric(http, "master_offload_queued") > 0:
                time.sleep(0.1)
            time.sleep(2)
            plain = Holder(addr, args.segment, "")
            rates = {"tier_on": [], "tier_off": []}
            for name, target in (("tier_on", holder.name), ("tier_off", plain.name)):
                cfg = ReplicateConfig()
                cfg.preferred_segment = target
                for i in range(128):
                    assert s.put(f"hit-{name}-{i}", os.urandom(4096), cfg) == 0
            for r in range(4):
                for name in (("tier_on", "tier_off") if r % 2 == 0 else ("tier_off", "tier_on")):
                    keys = [f"hit-{name}-{i}" for i in range(128)]
                    t = time.perf_counter()
                    n = 0
                    while time.perf_counter() - t < 2:
                        rcs = s.batch_get_into(keys, [base + i * 4096 for i in range(128)],
                                               [4096] * 128)
                        assert all(r == 4096 for r in rcs)
                        n += 128
                    rates[name].append(n / (time.perf_counter() - t))
            med = {k: (sorted(v)[1] + sorted(v)[2]) / 2 for k, v in rates.items()}
            out["dram_hits_4k_per_s"] = {k: round(v) for k, v in med.items()}
            out["dram_hits_on_over_off"] = round(med["tier_on"] / med["tier_off"], 3)
            plain.close()

    finally:
        s.close()
        holder.close()
        master.terminate()
        master.wait(10)
        shutil.rmtree(args.dir, ignore_errors=True)
    out["dd_write_gbps"] = round(out["dd_write_gbps"], 3)
    out["dd_read_gbps"] = round(out["dd_read_gbps"], 3)
    for row in out.get("sizes", []):
        row["offload_over_dd_write"] = round(row["offload_gbps"] / out["dd_write_gbps"], 2)
        row["disk_get_over_dd_read"] = round(row["disk_get_gbps"] / out["dd_read_gbps"], 2)
        # Against dd just before and after the offload, and over the bucket files right after
        # the gets (dd_write_now, dd_buckets_now): the device's own drift out of the ratio.
        row["offload_over_adjacent_dd_write"] = round(
            row["offload_gbps"] / row["dd_write_direct_adjacent_gbps"], 2)
        row["disk_get_over_dd_read_buckets"] = round(
            row["disk_get_gbps"] / row["dd_read_buckets_gbps"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
