"""Registration, managed buffers, raw byte access."""
import pytest

from mc_helpers import HostBuffer, engine, make_engine, segment_of


@pytest.fixture
def e():
    return make_engine()


def test_register_and_unregister(e):
    b = HostBuffer(8192)
    assert e.register_memory(b.addr, b.size) == 0
    assert e.get_first_buffer_address(segment_of(e)) == b.addr
    assert e.unregister_memory(b.addr) == 0
    assert e.unregister_memory(b.addr) == -3


def test_register_keywords_and_location(e):
    b = HostBuffer(4096)
    assert e.register_memory(buffer_addr=b.addr, capacity=b.size, location="cpu:0") == 0


def test_register_errors(e, capfd):
    b = HostBuffer(8192)
    assert e.register_memory(b.addr, 0) == -1, "zero length"
    assert e.register_memory(0, 100) == -1, "null address"
    assert e.register_memory(b.addr, b.size) == 0
    assert e.register_memory(b.addr + 100, 10) == -7, "overlap inside"
    assert e.register_memory(b.addr - 10, 20) == -7, "overlap at the start"
    assert e.register_memory(b.addr, b.size) == -7, "same range twice"
    assert e.unregister_memory(b.addr + 1) == -3, "not the start of a buffer"
    assert e.unregister_memory(12345) == -3
    err = capfd.readouterr().err
    assert "register_memory" in err and "overlaps" in err and "length is 0" in err


def test_batch_register(e):
    a, b, c = HostBuffer(4096), HostBuffer(4096), HostBuffer(4096)
    assert e.batch_register_memory([a.addr, b.addr], [a.size, b.size]) == 0
    assert e.batch_unregister_memory([a.addr, b.addr]) == 0
    assert e.batch_register_memory(buffer_addresses=[a.addr], capacities=[a.size],
                                   location="*") == 0
    assert e.batch_unregister_memory([a.addr]) == 0


def test_batch_register_errors_register_nothing(e, capfd):
    a, b = HostBuffer(4096), HostBuffer(4096)
    assert e.batch_register_memory([a.addr, b.addr], [a.size]) == -1, "mismatched lists"
    assert e.batch_register_memory([a.addr, a.addr + 10], [a.size, 10]) == -7, "mutual overlap"
    assert e.batch_register_memory([a.addr, b.addr], [a.size, 0]) == -1, "zero length"
    err = capfd.readouterr().err
    assert "1 capacities" in err
    assert e.register_memory(a.addr, a.size) == 0, "nothing was registered by the failed calls"
    assert e.register_memory(b.addr, b.size) == 0


def test_batch_unregister_reports_first_error_and_unregisters_the_rest(e):
    a, b = HostBuffer(4096), HostBuffer(4096)
    assert e.batch_register_memory([a.addr, b.addr], [a.size, b.size]) == 0
    assert e.batch_unregister_memory([a.addr, 999, b.addr]) == -3
    assert e.register_memory(b.addr, b.size) == 0, "b was unregistered despite the error"


def test_managed_buffers(e):
    sizes = [1, 8192, 8193, 1 << 20, (256 << 20) + 1]
    addrs = [e.allocate_managed_buffer(n) for n in sizes]
    assert all(addrs) and len(set(addrs)) == len(addrs)
    spans = sorted((a, a + n) for a, n in zip(addrs, sizes))
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), "no overlap"
    for a, n in zip(addrs, sizes):
        data = bytes([n % 251]) * min(n, 4096)
        assert e.write_bytes_to_buffer(a, data, len(data)) == 0
        assert e.read_bytes_from_buffer(a, len(data)) == data
    # managed memory is registered: it cannot be registered again
    assert e.register_memory(addrs[1], 10) == -7
    for a, n in zip(addrs, sizes):
        assert e.free_managed_buffer(a, n) == 0
    # a freed block of a class is handed out again
    assert e.allocate_managed_buffer(8000) == addrs[1]


def test_managed_buffer_errors(e, capfd):
    assert e.allocate_managed_buffer(0) == 0
    a = e.allocate_managed_buffer(100)
    assert e.free_managed_buffer(a, 1 << 20) == -1, "length of another size class"
    assert e.free_managed_buffer(a, 100) == 0
    assert e.free_managed_buffer(a, 100) == -3, "double free"
    assert e.free_managed_buffer(12345, 100) == -3
    err = capfd.readouterr().err
    assert "allocate_managed_buffer(0)" in err and "freed already" in err


def test_managed_buffers_are_reachable_by_peers(e):
    peer = make_engine()
    src = peer.allocate_managed_buffer(65536)
    dst = e.allocate_managed_buffer(65536)
    peer.write_bytes_to_buffer(src, b"\x42" * 65536, 65536)
    assert peer.transfer_sync_write(segment_of(e), src, dst, 65536) == 0
    assert e.read_bytes_from_buffer(dst, 65536) == b"\x42" * 65536


def test_raw_bytes_errors(e, capfd):
    b = HostBuffer(16)
    assert e.write_bytes_to_buffer(b.addr, b"abc", 5) == -1, "length larger than src"
    assert e.write_bytes_to_buffer(0, b"abc", 3) == -1
    assert e.write_bytes_to_buffer(b.addr, b"abcdef", 3) == 0
    assert b.read(0, 4) == b"abc\0"
    assert e.read_bytes_from_buffer(0, 5) == b""
    assert e.read_bytes_from_buffer(b.addr, 0) == b""
    assert "write_bytes_to_buffer" in capfd.readouterr().err
