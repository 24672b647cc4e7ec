"""The local hot cache (MC_STORE_LOCAL_HOT_CACHE_SIZE) through the Python API, over TCP, with
the writer in this process and the reader (the cache) in another: repeated gets return the
value, and a value another client upserted, removed or wrote again is never served from the
cache. A size that is not plain bytes is refused with a message and the Store still works."""
import pytest

from store_helpers import Master, StoreProc, data, new_store

pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def master():
    m = Master(default_kv_lease_ttl=100)
    yield m
    m.stop()


def test_repeated_gets_and_never_a_replaced_value(master):
    writer = new_store(master, global_segment_size=64 << 20)
    reader = StoreProc(master, global_segment_size=0,
                       env={"MC_STORE_LOCAL_HOT_CACHE_SIZE": str(8 << 20),
                            "MC_STORE_LOCAL_HOT_BLOCK_SIZE": str(1 << 20), "MC_FORCE_TCP": "1"})
    try:
        v1, v2, v3 = data(1, 200000), data(2, 200000), data(3, 200000)
        assert writer.put("k", v1) == 0
        for _ in range(4):
            assert reader.call("result = store.get('k')") == v1
        assert writer.upsert("k", v2) == 0
        assert reader.call("result = store.get('k')") == v2
        assert reader.call("result = store.get('k')") == v2
        assert writer.remove("k", True) == 0
        assert reader.call("result = store.get('k')") == b""
        assert writer.put("k", v3) == 0
        assert reader.call("result = store.get('k')") == v3
        # Batches mixing cached, new and missing keys.
        assert writer.put("m", v1) == 0
        got = reader.call("result = store.get_batch(['k', 'm', 'absent', 'k'])")
        assert got == [v3, v1, b"", v3]
        with open(reader.log.name) as log:
            assert "local hot cache: 8388608 bytes in blocks of 1048576" in log.read()
    finally:
        reader.close()
        writer.remove_all(force=True)
        writer.close()


def test_a_size_that_is_not_plain_bytes_is_refused_and_the_store_works(master):
    writer = new_store(master, global_segment_size=16 << 20)
    reader = StoreProc(master, global_segment_size=0,
                       env={"MC_STORE_LOCAL_HOT_CACHE_SIZE": "8GB"})
    try:
        assert writer.put("x", b"value") == 0
        assert reader.call("result = store.get('x')") == b"value"
        with open(reader.log.name) as log:
            text = log.read()
        assert 'MC_STORE_LOCAL_HOT_CACHE_SIZE="8GB" is not a plain number of bytes' in text
        assert "the local hot cache is off" in text
    finally:
        reader.close()
        writer.remove_all(force=True)
        writer.close()
