"""Replica tasks, upstream's calls and shapes: create_copy_task / create_move_task return
(task_id, rc) with the id a (u64, u64) tuple, query_task returns (QueryTaskResponse, 0) or
(None, rc); TaskType and TaskStatus carry upstream's values. The client owning the source
runs the task; the new replica reads back byte-exact once SUCCESS (also after the source's
holder left), a move leaves the object on the target only, and the checks answer upstream's
codes."""
import json
import os
import time
import urllib.request

import pytest

from store_helpers import Master, new_store

MiB = 1 << 20


@pytest.fixture(scope="module")
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture
def trio(master):
    a = new_store(master, global_segment_size=32 * MiB)
    b = new_store(master, global_segment_size=32 * MiB)
    user = new_store(master)
    yield a, b, user
    for s in (user, b, a):
        s.close()


def holders(master, key):
    """The segments (transport endpoints) holding complete replicas of key, from /query_key."""
    url = f"http://127.0.0.1:{master.metrics_port}/query_key?key={key}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError:
        return set()
    return {d["transport_endpoint_"] for d in body["data"]}


def wait_task(store, task_id, timeout=20):
    from mooncake.store import TaskStatus
    deadline = time.time() + timeout
    while True:
        resp, rc = store.query_task(task_id)
        assert rc == 0 and resp is not None
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED) or time.time() > deadline:
            return resp
        time.sleep(0.05)


def put_on(user, key, value, segment):
    from mooncake.store import ReplicateConfig
    config = ReplicateConfig()
    config.preferred_segment = segment
    assert user.put(key, value, config) == 0


def test_enums_and_response_have_upstreams_names_and_values():
    from mooncake.store import QueryTaskResponse, TaskStatus, TaskType
    import mooncake.store as store
    assert (int(TaskType.REPLICA_COPY), int(TaskType.REPLICA_MOVE)) == (0, 1)
    assert [int(getattr(TaskStatus, n)) for n in ("PENDING", "PROCESSING", "FAILED",
                                                   "SUCCESS")] == [0, 1, 2, 3]
    assert store.SUCCESS == TaskStatus.SUCCESS  # upstream exports the members too
    assert QueryTaskResponse.__name__ == "QueryTaskResponse"


def test_a_copy_reads_back_after_the_source_holder_left(master, trio):
    from mooncake.store import TaskStatus, TaskType
    a, b, user = trio
    value = os.urandom(3 * MiB + 17)
    put_on(user, "k", value, a.get_hostname())
    assert holders(master, "k") == {a.get_hostname()}
    task_id, rc = user.create_copy_task("k", [b.get_hostname()])
    assert rc == 0 and isinstance(task_id, tuple) and len(task_id) == 2 and task_id != (0, 0)
    resp = wait_task(user, task_id)
    assert resp.status == TaskStatus.SUCCESS, resp.message
    assert resp.type == TaskType.REPLICA_COPY
    assert resp.id == task_id
    assert resp.message == "Task completed successfully"
    assert isinstance(resp.assigned_client, tuple) and resp.assigned_client != (0, 0)
    assert resp.last_updated_at_ms_epoch >= resp.created_at_ms_epoch > 0
    assert "QueryTaskResponse(" in repr(resp)
    assert holders(master, "k") == {a.get_hostname(), b.get_hostname()}
    a.close()  # the source leaves with its replica; the copy stays
    assert holders(master, "k") == {b.get_hostname()}
    assert user.get("k") == value


def test_replica_descriptors_say_where_the_replicas_lie(master, trio):
    from mooncake.store import ReplicaStatus
    a, b, user = trio
    put_on(user, "d", b"z" * 5000, a.get_hostname())
    descs = user.get_replica_desc("d")
    assert len(descs) == 1
    d = descs[0]
    assert d.is_memory_replica() and not d.is_disk_replica() and not d.is_local_disk_replica()
    assert d.status == ReplicaStatus.COMPLETE
    buf = d.get_memory_descriptor().buffer_descriptor
    assert buf.transport_endpoint == a.get_hostname() and buf.size == 5000
    assert buf.buffer_address != 0 and "transport_endpoint=" in repr(buf)
    assert user.get_replica_desc("missing") == []
    both = user.batch_get_replica_desc(["d", "missing"])
    assert list(both) == ["d"]
    assert both["d"][0].get_memory_descriptor().buffer_descriptor.buffer_address == \
        buf.buffer_address


def test_a_move_leaves_the_object_on_the_target_only(master, trio):
    from mooncake.store import TaskStatus, TaskType
    a, b, user = trio
    value = os.urandom(200_000)
    put_on(user, "m", value, a.get_hostname())
    task_id, rc = user.create_move_task("m", a.get_hostname(), b.get_hostname())
    assert rc == 0
    resp = wait_task(user, task_id)
    assert resp.status == TaskStatus.SUCCESS, resp.message
    assert resp.type == TaskType.REPLICA_MOVE
    assert holders(master, "m") == {b.get_hostname()}
    assert user.get("m") == value


def test_upstreams_checks_and_codes(trio):
    a, b, user = trio
    put_on(user, "c", b"v" * 1000, a.get_hostname())
    assert user.create_copy_task("missing", [b.get_hostname()]) == ((0, 0), -704)
    assert user.create_copy_task("c", []) == ((0, 0), -600)
    assert user.create_copy_task("c", ["127.0.0.1:1"]) == ((0, 0), -600)  # not mounted
    assert user.create_move_task("missing", a.get_hostname(), b.get_hostname()) == ((0, 0), -704)
    assert user.create_move_task("c", a.get_hostname(), a.get_hostname()) == ((0, 0), -600)
    assert user.create_move_task("c", b.get_hostname(), a.get_hostname()) == ((0, 0), -600)
    assert user.query_task((1, 2)) == (None, -1400)
    # A target that holds a replica already needs nothing: success at once.
    task_id, rc = user.create_copy_task("c", [a.get_hostname()])
    assert rc == 0
    assert wait_task(user, task_id).message == "Task completed successfully"


def test_init_all_is_setup_with_upstreams_fixed_values(master, monkeypatch):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    seen = []
    monkeypatch.setattr(MooncakeDistributedStore, "setup",
                        lambda self, *a, **k: seen.append(a) or 0, raising=True)
    assert s.init_all("tcp", "", 32 * MiB) == 0
    assert seen == [("localhost:12345", "127.0.0.1:2379", 32 * MiB, 1 << 30, "tcp", "",
                     "127.0.0.1:50051")]
    monkeypatch.undo()
    real = new_store(master)
    assert real.init_all("tcp", "") == -600  # already set up
    real.close()


def test_the_allocator_function_addresses_are_upstreams_without_nof():
    import ctypes
    import mooncake.store as store
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(store.get_alloc_func_addr())
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(store.get_free_func_addr())
    assert alloc(4096) is None  # NULL: no NoF (SPDK hugepages) in this build, as upstream's
    free(None)


def test_a_store_not_set_up_answers_not_ready():
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.create_copy_task("k", ["x"]) == ((0, 0), -1)
    assert s.create_move_task("k", "x", "y") == ((0, 0), -1)
    assert s.query_task((1, 2)) == (None, -1)
