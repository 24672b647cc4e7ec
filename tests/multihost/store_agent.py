"""A Store client driven over stdin/stdout, one JSON object a line each way (run on a host with
the project's venv: host.run([cluster.venv_python, AGENT], pipe=True)). Prints {"ready": true},
then answers each request with one line:
  {"op": "setup", "host": ip, "master": "ip:port", "segment": n, "buffer": n
   [, "tenant": t] [, "offload": directory (the disk tier)]}  -> {"rc": 0}
  {"op": "put_random", "prefix": p, "count": n, "size": s}  -> {"rcs": [...], "sha": {key: hex},
      "seconds": t}   (random bytes from os.urandom, key = prefix + index)
  {"op": "get", "keys": [...], "size": s}  -> {"rc": {key: bytes read or a negative code},
      "sha": {key: hex of the bytes read}, "seconds": t, "max_seconds": slowest get}
  {"op": "allocate", "size": n}  -> allocate_and_mount_segment's dict
  {"op": "unmount_free", "ids": [...]}  -> {"rc": unmount_and_free_segment's code}
  {"op": "hostname"}  -> {"name": get_hostname()}  (its segment's name)
  {"op": "copy", "key": k, "targets": [...]}  -> {"id": [hi, lo], "rc": rc}
  {"op": "move", "key": k, "source": s, "target": t}  -> {"id": [hi, lo], "rc": rc}
  {"op": "query", "id": [hi, lo]}  -> {"rc": rc, "status": n, "message": m}
  {"op": "close"}  -> {"rc": ...}   and EOF on stdin ends it.
put_random takes an optional "replicas" (ReplicateConfig.replica_num), "preferred" (a
segment name: ReplicateConfig.preferred_segment) and "retry_full" (retry a put answered -200,
no space now, for up to 30 s).
"""
import hashlib
import json
import os
import sys
import time

import numpy as np
from mooncake.store import MooncakeDistributedStore, ReplicateConfig


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    store = None
    reply({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "setup":
            store = MooncakeDistributedStore()
            rc = store.setup(req["host"], "P2PHANDSHAKE", req["segment"], req["buffer"], "tcp",
                             "", req["master"], tenant_id=req.get("tenant", "default"),
                             enable_ssd_offload=bool(req.get("offload")),
                             ssd_offload_path=req.get("offload", ""))
            reply({"rc": rc})
        elif op == "put_random":
            rcs, sha = [], {}
            cfg = ReplicateConfig()
            cfg.replica_num = req.get("replicas", 1)
            if req.get("preferred"):
                cfg.preferred_segment = req["preferred"]
            t0 = time.monotonic()
            for i in range(req["count"]):
                key = f"{req['prefix']}{i}"
                data = os.urandom(req["size"])
                rc = store.put(key, data, cfg)
                deadline = time.monotonic() + 30
                while rc == -200 and req.get("retry_full") and time.monotonic() < deadline:
                    time.sleep(0.05)  # the pool is full of objects waiting for a disk
                    rc = store.put(key, data, cfg)
                rcs.append(rc)
                sha[key] = hashlib.sha256(data).hexdigest()
            reply({"rcs": rcs, "sha": sha, "seconds": time.monotonic() - t0})
        elif op == "get":
            buf = np.zeros(req["size"], dtype=np.uint8)
            rcs, sha, slowest = {}, {}, 0.0
            t0 = time.monotonic()
            for key in req["keys"]:
                t = time.monotonic()
                n = store.get_into(key, buf.ctypes.data, buf.nbytes)
                slowest = max(slowest, time.monotonic() - t)
                rcs[key] = n
                if n >= 0:
                    sha[key] = hashlib.sha256(buf[:n].tobytes()).hexdigest()
            reply({"rc": rcs, "sha": sha, "seconds": time.monotonic() - t0,
                   "max_seconds": slowest})
        elif op == "allocate":
            reply(store.allocate_and_mount_segment(req["size"]))
        elif op == "unmount_free":
            reply({"rc": store.unmount_and_free_segment(req["ids"])})
        elif op == "hostname":
            reply({"name": store.get_hostname()})
        elif op in ("copy", "move"):
            if op == "copy":
                task_id, rc = store.create_copy_task(req["key"], req["targets"])
            else:
                task_id, rc = store.create_move_task(req["key"], req["source"], req["target"])
            reply({"id": list(task_id), "rc": rc})
        elif op == "query":
            resp, rc = store.query_task(tuple(req["id"]))
            reply({"rc": rc, "status": int(resp.status) if resp else None,
                   "message": resp.message if resp else None})
        elif op == "close":
            reply({"rc": store.close() if store else 0})
            store = None
        else:
            reply({"error": f"unknown op {op}"})


if __name__ == "__main__":
    main()
