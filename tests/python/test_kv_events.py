"""The master's KV events with a real subscriber (pyzmq + msgpack, as the Dynamo router and
Mooncake's conductor read them): puts, removes and evictions of a real Store become stored /
removed events with upstream's fields; /kv_events/status counts them; the replay socket gives
kept batches and snapshots; a master told to publish without an endpoint says so and serves."""
import json
import urllib.request

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
np = pytest.importorskip("numpy")

from store_helpers import Master, free_port, new_store, wait_until  # noqa: E402

END = (1 << 64) - 1
SNAPSHOT = (1 << 64) - 2


def be(n):
    return n.to_bytes(8, "big")


class Subscriber:
    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.batches = []  # (seq, [event maps])

    def pump(self, timeout_ms=200):
        while self.sub.poll(timeout_ms):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b""
            ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
            assert isinstance(ts, int) and dp_rank == 0 and 1 <= len(events) <= 64
            self.batches.append((int.from_bytes(seq, "big"), events))
            timeout_ms = 50

    def events(self):
        return [e for _seq, batch in self.batches for e in batch]

    def wait_for(self, pred, what):
        def seen():
            self.pump()
            return pred(self.events())
        wait_until(seen, 15, what=what)
        return self.events()

    def close(self):
        self.sub.close()
        self.ctx.term()


@pytest.fixture
def master():
    pub, replay = free_port(), free_port()
    m = Master(enable_kv_events="true", kv_events_bind_endpoint=f"tcp://127.0.0.1:{pub}",
               kv_events_backend_id="pool-a", kv_events_replay_endpoint=f"tcp://127.0.0.1:{replay}",
               kv_events_snapshot_interval_ms=100, default_kv_lease_ttl=100,
               eviction_high_watermark_ratio=0.8, eviction_ratio=0.2)
    m.pub, m.replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
    yield m
    m.stop()


def status(m):
    url = f"http://127.0.0.1:{m.metrics_port}/kv_events/status"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def connected(m, sub, store):
    """Puts probe keys until the subscriber sees one (a SUB socket joins asynchronously)."""
    for i in range(200):
        store.put(f"probe-{i}", b"p")
        sub.pump(50)
        if sub.events():
            return
    raise AssertionError("the subscriber never received an event")


def test_puts_removes_and_evictions_become_events_with_upstreams_fields(master):
    store = new_store(master, global_segment_size=16 << 20)
    sub = Subscriber(master.pub)
    try:
        connected(master, sub, store)
        assert store.put("12345", b"x" * 100) == 0
        assert store.put("0xABC", b"y") == 0
        assert store.put("sglang/layer0/chunk", b"z") == 0
        assert store.remove("12345") == 0
        events = sub.wait_for(lambda ev: any(e["event_type"] == "removed" and
                                            e["object_key"] == "12345" for e in ev), "removed")
        by_key = {}
        for e in events:
            by_key.setdefault(e["object_key"], []).append(e)
        stored = by_key["12345"][0]
        assert stored["event_type"] == "stored" and stored["type"] == "BlockStored"
        assert stored["seq_hashes"] == [12345] and stored["block_hashes"] == [12345]
        assert stored["backend_id"] == "pool-a" and stored["tenant_id"] == "default"
        assert stored["medium"] == "cpu" and stored["base_block_idx"] == 0
        for nil in ("model_name", "block_size", "additional_salt", "lora_name", "dp_rank",
                    "group_id", "parent_hash", "token_ids", "parent_block_hash"):
            assert stored[nil] is None, nil
        assert by_key["0xABC"][0]["seq_hashes"] == [0xABC]
        assert by_key["sglang/layer0/chunk"][0]["seq_hashes"] == []
        removed = by_key["12345"][1]
        assert removed["type"] == "BlockRemoved" and removed["base_block_idx"] is None
        seqs = [s for s, _ in sub.batches]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        ids = [e["event_id"] for e in events]
        assert ids == sorted(ids)

        # Fill past the high watermark: the evicted keys are reported removed.
        blob = np.random.default_rng(0).bytes(1 << 20)
        for i in range(40):
            store.put(f"big-{i}", blob)
        sub.wait_for(lambda ev: any(e["event_type"] == "removed" and
                                    e["object_key"].startswith("big-") for e in ev),
                     "an eviction's removed event")
        st = status(master)
        assert st["enabled"] is True and st["dropped_events"] == 0
        assert st["published_events"] >= len(sub.events())
        assert st["skipped_unparsed_keys"] >= 1  # the sglang key is not a hash
    finally:
        sub.close()
        store.close()


def test_replay_and_snapshot_rebuild_an_index(master):
    store = new_store(master, global_segment_size=16 << 20)
    sub = Subscriber(master.pub)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(master.replay)
    try:
        connected(master, sub, store)
        for i in range(5):
            assert store.put(f"{1000 + i}", b"v") == 0
        sub.wait_for(lambda ev: sum(e["object_key"].startswith("100") for e in ev) == 5, "5")
        first = sub.batches[0][0]

        def request(start):
            dealer.send(be(start))
            replies = []
            while True:
                assert dealer.poll(5000), "no reply from the replay socket"
                seq, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq, "big")
                if seq == END:
                    return replies
                replies.append((seq, payload))

        replayed = request(first)
        assert [s for s, _ in replayed] == [s for s, _ in sub.batches if s >= first]
        assert [msgpack.unpackb(p)[1] for _, p in replayed] == \
            [b for s, b in sub.batches if s >= first]

        # A subscriber that starts late (or after a failover) asks for a snapshot: the keys
        # held now, and the sequence number from which live batches apply on top.
        store.remove("1000")
        replies = request(END)
        assert replies[0][0] == SNAPSHOT
        resume = int.from_bytes(replies[0][1], "big")
        index = {e["object_key"] for seq, p in replies[1:]
                 for e in msgpack.unpackb(p, raw=False)[1]}
        held = {k for k in index if not k.startswith("probe-")}
        assert held == {"1001", "1002", "1003", "1004"}
        assert resume == status(master)["next_sequence"]
        assert status(master)["snapshots"] == 1
    finally:
        dealer.close()
        ctx.term()
        sub.close()
        store.close()


def test_events_without_an_endpoint_are_refused_and_the_master_serves_on():
    with Master(enable_kv_events="true", kv_events_backend_id="pool-b") as m:
        store = new_store(m, global_segment_size=8 << 20)
        try:
            assert store.put("k", b"v") == 0 and store.get("k") == b"v"
            assert status(m) == {"enabled": False, "published_batches": 0,
                                 "published_events": 0, "dropped_events": 0,
                                 "skipped_unparsed_keys": 0}
        finally:
            store.close()
        with open(m.log.name) as log:
            assert "kv_events_bind_endpoint is empty" in log.read()
