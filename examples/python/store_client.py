"""One client of the Store example (examples/python/run_store.sh): a writer that puts objects
and keeps serving them, or a reader in another process that gets them and checks every byte.

    python store_client.py writer --master 127.0.0.1:50051 --count 16 --size 1048576
    python store_client.py reader --master 127.0.0.1:50051 --count 16 --size 1048576
"""
import argparse
import hashlib
import sys
import time

from mooncake.store import MooncakeDistributedStore, ReplicateConfig


def payload(i, size):
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["writer", "reader"])
    ap.add_argument("--master", default="127.0.0.1:50051")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--size", type=int, default=1 << 20)
    args = ap.parse_args()

    store = MooncakeDistributedStore()
    rc = store.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                      "global_segment_size": "256MB", "local_buffer_size": "64MB",
                      "protocol": "tcp", "master_server_addr": args.master})
    if rc != 0:
        print(f"{args.role}: setup failed: {rc}", file=sys.stderr)
        return 1
    print(f"{args.role}: segment {store.get_hostname()}", flush=True)
    keys = [f"demo/{i}" for i in range(args.count)]
    if args.role == "writer":
        config = ReplicateConfig()
        config.replica_num = 2  # on distinct segments where several clients are mounted
        for i, key in enumerate(keys):
            rc = store.put(key, payload(i, args.size), config)
            if rc != 0:
                print(f"writer: put {key} failed: {rc}", file=sys.stderr)
                return 1
        print(f"writer: put {len(keys)} objects of {args.size} bytes", flush=True)
        print("writer_ready", flush=True)
        try:
            while True:  # the objects stay reachable while this process lives
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    else:
        exist = store.batch_is_exist(keys)
        good = 0
        for i, key in enumerate(keys):
            if store.get(key) == payload(i, args.size):
                good += 1
        print(f"reader: exist {sum(1 for e in exist if e == 1)}/{len(keys)}, "
              f"matched {good}/{len(keys)} objects ({good * args.size} bytes)", flush=True)
        if good != len(keys):
            return 1
        # The reads above hold leases (--default_kv_lease_ttl): force removes anyway.
        print(f"reader: remove_all(force=True) -> {store.remove_all(force=True)}", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
