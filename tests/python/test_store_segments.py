"""Run-time segments, upstream's calls and return shapes: allocate_and_mount_segment /
unmount_and_free_segment and mount_segment (a /dev/shm object or a file) / unmount_segment
lend more memory at run time; objects land there, read back from another client, and leave
with the segment. Bad paths, ranges and ids fail with -600 and mount nothing."""
import mmap
import os
import tempfile

import pytest

from store_helpers import Master, new_store

MiB = 1 << 20


@pytest.fixture(scope="module")
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture
def pair(master):
    holder, user = new_store(master), new_store(master)  # neither lends memory at setup
    yield holder, user
    user.close()
    holder.close()


def test_an_allocated_segment_lends_memory_until_it_is_freed(pair):
    holder, user = pair
    assert user.put("early", b"x") != 0  # no memory in the pool yet
    r = holder.allocate_and_mount_segment(3 * MiB)
    assert r["ret"] == 0 and r["allocated_size"] == 16 * MiB and len(r["segment_ids"]) == 1
    value = os.urandom(2 * MiB)
    assert user.put("k", value) == 0
    assert user.get("k") == value
    assert holder.get("k") == value
    assert holder.unmount_segment(r["segment_ids"]) == -600  # not a mount_segment segment
    assert holder.unmount_and_free_segment(r["segment_ids"]) == 0
    assert user.get("k") == b""
    assert holder.unmount_and_free_segment(r["segment_ids"]) == -600  # once
    r = holder.allocate_and_mount_segment(0)
    assert r == {"ret": -600, "segment_ids": [], "allocated_size": 0}


def test_a_shared_memory_file_holds_the_objects(pair):
    holder, user = pair
    fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, 8 * MiB)
        r = holder.mount_segment(path, 4 * MiB, offset=mmap.PAGESIZE, protocol="tcp")
        assert r["ret"] == 0 and len(r["segment_ids"]) == 1
        value = os.urandom(100_000)
        assert user.put("f", value) == 0
        assert user.get("f") == value
        with open(path, "rb") as f:
            content = f.read()
        at = content.find(value)
        assert mmap.PAGESIZE <= at and at + len(value) <= mmap.PAGESIZE + 4 * MiB
        assert holder.unmount_segment(r["segment_ids"], grace_period_seconds=0) == 0
        assert user.get("f") == b""
        # Bad requests: nothing mounted, -600, no id.
        for args in (("/nonexistent/x", MiB), (path, 0), (path, MiB, 100), (path, 9 * MiB),
                     ("/tmp", MiB)):
            assert holder.mount_segment(*args) == {"ret": -600, "segment_ids": []}, args
        assert user.put("g", b"y") != 0
        assert holder.unmount_segment(["1-2", "junk"]) == -600
        assert holder.unmount_segment([], grace_period_seconds=-1) == -600
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_store_not_set_up_answers_not_ready():
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.allocate_and_mount_segment(MiB)["ret"] == -1
    assert s.mount_segment("/dev/shm/x", MiB)["ret"] == -1
    assert s.unmount_segment(["1-2"]) == -1
    assert s.unmount_and_free_segment(["1-2"]) == -1
