#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (checked in; rerun after changing an
input format). Seeds are valid frames, descriptors and request streams, plus a few that
stop at each documented refusal."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")

# fuzz_common.h: Arena at kFixedBase.
BASE = 0x2A0000000000
GUARD, RED = 512 << 10, 4096
REMOTE = BASE + GUARD + RED                      # 64 KiB, remote accessible
LOCAL = REMOTE + (64 << 10) + RED + GUARD        # 16 KiB, not remote accessible
SCRATCH = LOCAL + (16 << 10) + GUARD             # 64 KiB, the SHM target's initiator memory
REMOTE_SIZE = 64 << 10


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- fuzz_handshake_frame
def frame(t, payload):
    return struct.pack("<Q", len(payload) + 1) + bytes([t]) + payload


def handshake():
    lim_1m = b"\x00"  # byte 0 % 8 == 0: MC_HANDSHAKE_MAX_LENGTH default (1 MiB)
    desc = open(os.path.join(ROOT, "tests/interop/fixtures/upstream_descriptor_tcp.json"),
                "rb").read().strip() + b"\n"
    seeds = {
        "metadata_request": frame(1, b"{}"),
        "metadata_reply": frame(1, desc),
        "notify": frame(2, b'{"name":"x","notify_msg":"hello"}'),
        "notify_upstream_newline": frame(2, b'{"name":"peer","notify_msg":"done"}\n'),
        "notify_reply": frame(2, b'{"name":"","notify_msg":"success"}\n'),
        "notify_bad_types": frame(2, b'{"name":1,"notify_msg":[true,null,{"a":"\\u00e9"}]}'),
        "notify_not_object": frame(2, b'["name","x"]'),
        "notify_deep": frame(2, b"[" * 33 + b"]" * 33),
        "notify_escapes": frame(2, b'{"name":"a\\"[{","notify_msg":"\\\\"}'),
        "probe": frame(3, b"{}"),
        "probe_reply": frame(3, b'{"status":"success"}\n'),
        "connection_typed": frame(0, b"{}"),
        "connection_legacy": struct.pack("<Q", 2) + b"{}",
        "reserved_type": frame(0xFE, b"{}"),
        "length_zero": struct.pack("<Q", 0) + b"\x01",
        "truncated": struct.pack("<Q", 100) + b"\x01{}",
    }
    for name, data in seeds.items():
        write("fuzz_handshake_frame", name, lim_1m + data)
    # Limits: byte 0 = 3 -> limit 9; a 9-byte frame (accepted) and a 10-byte one (refused).
    write("fuzz_handshake_frame", "limit_equal", b"\x03" + frame(1, b"12345678"))
    write("fuzz_handshake_frame", "limit_over", b"\x03" + frame(1, b"123456789"))


# ---------------------------------------------------------------- fuzz_segment_desc
def segment_desc():
    fixture = open(os.path.join(ROOT, "tests/interop/fixtures/upstream_descriptor_tcp.json"),
                   "rb").read()
    write("fuzz_segment_desc", "upstream_descriptor_tcp.json", fixture)
    ours = ('{"buffers":[{"addr":140391742939136,"length":4096,"name":"127.0.0.1:15614"}],'
            '"name":"127.0.0.1:15614","protocol":"tcp","rdma_server_name":"","tcp_data_host":'
            '"127.0.0.1","tcp_data_port":16138,"tcp_proto_version":2,"timestamp":'
            '"2026-11-29 21:43:23.861472"}\n')
    write("fuzz_segment_desc", "ours_doc_example.json", ours)
    write("fuzz_segment_desc", "minimal.json", '{"name":"h:1","protocol":"tcp"}')
    write("fuzz_segment_desc", "shm_fields.json", json.dumps({
        "name": "10.0.0.1:15001", "protocol": "tcp", "tcp_data_port": 15002,
        "tcp_proto_version": 2, "mc_host_id": "boot/pid:[4026531836]/net:[4026531840]",
        "mc_pid": 4242, "mc_shm_path": "mooncake-shm-4242-abcdef",
        "buffers": [{"addr": 4096, "length": 8192, "name": "cpu:0"},
                    {"addr": 18446744073709547520, "length": 4096, "name": ""}]},
        separators=(",", ":")))
    write("fuzz_segment_desc", "protocol_array.json",
          '{ "protocol" : ["rdma","tcp"], "name" : "[::1]:15001", "tcp_data_port" : 0,'
          ' "unknown": {"x": [1, 2.5, -3]}, "buffers" : [] }\n')
    write("fuzz_segment_desc", "bad_buffer.json",
          '{"name":"a","protocol":"tcp","buffers":[{"addr":1,"length":18446744073709551615}]}')
    write("fuzz_segment_desc", "utf8_names.json",
          '{"name":"h\\u00e9:1","protocol":"t\\ud83d\\ude00","tcp_data_host":"\\u0000x",'
          '"timestamp":"2026-01-01 00:00:00.000000"}')


# ---------------------------------------------------------------- TCP targets
def hdr(size, addr, op):
    return struct.pack("<QQB7x", size, addr, op)


FENCE_MAGIC = 0x3156454E43464D4D


def ctl(op, session, conn, floor, live):
    body = struct.pack("<QQQII", session, conn, floor, len(live), 0) + b"".join(
        struct.pack("<Q", x) for x in live)
    return struct.pack("<QQB7x", len(body), FENCE_MAGIC, op) + body


def tcp():
    payload = bytes((i * 7) & 0xFF for i in range(4096))
    raw = {
        # v2 WRITE 4 KiB at the buffer, then v2 READ it back.
        "raw_v2_write_read": hdr(4096, REMOTE, 0x81) + payload + hdr(4096, REMOTE, 0x80),
        # v1 the same.
        "raw_v1_write_read": hdr(4096, REMOTE + 100, 0x01) + payload + hdr(16, REMOTE, 0x00),
        # Large v2 WRITE (direct receive path, >= 16 KiB) ending at the last byte.
        "raw_v2_write_large": hdr(32768, REMOTE + REMOTE_SIZE - 32768, 0x81) +
                              bytes(i & 0xFF for i in range(32768)) + hdr(1, REMOTE, 0x80),
        # Pipelined small v2 WRITEs, then a READ of the whole buffer.
        "raw_v2_pipeline": b"".join(hdr(8, REMOTE + 8 * i, 0x81) + struct.pack("<Q", i)
                                    for i in range(64)) + hdr(REMOTE_SIZE, REMOTE, 0x80),
        # Refusals: one byte past the end (v2), buffer without remote access, unknown op.
        "raw_v2_reject_end": hdr(8, REMOTE, 0x81) + b"A" * 8 + hdr(2, REMOTE + REMOTE_SIZE - 1, 0x80),
        "raw_v2_reject_local": hdr(16, LOCAL, 0x80),
        "raw_v1_reject_before": hdr(16, REMOTE - 1, 0x00),
        "raw_unknown_op": hdr(16, REMOTE, 0x82),
        "raw_truncated_write": hdr(4096, REMOTE, 0x81) + payload[:1000],
        # Fencing (wire_protocol.md 3.6): HELLO, a write, an in-band FENCE, a read.
        "raw_hello_fence": ctl(0x90, 7, 3, 3, [3]) + hdr(4096, REMOTE, 0x81) + payload +
                           ctl(0x91, 7, 0, 5, [3, 5]) + hdr(4096, REMOTE, 0x80),
        # Refusals: FENCE without HELLO, HELLO after a request, a count that lies.
        "raw_fence_first": ctl(0x91, 7, 0, 5, []) + hdr(16, REMOTE, 0x80),
        "raw_hello_late": hdr(16, REMOTE, 0x80) + ctl(0x90, 7, 1, 1, [1]),
        "raw_hello_bad_count": ctl(0x90, 7, 1, 1, [1])[:48] + struct.pack("<Q", 9) +
                               struct.pack("<Q", 1),
    }
    for name, data in raw.items():
        write("fuzz_tcp_server", name, b"\x00" + data)
        write("fuzz_tcp_session", name, b"\x00" + data)

    def req(k, off, size_bytes, extra=b""):
        return bytes([k]) + struct.pack("<i", off)[:3] + size_bytes + extra
    # Structured (mode 1): k bit0 WRITE, bit1 v2, bits 4-5 size class.
    structured = {
        "st_v2_write_read": b"\x01" + req(0x13, 0, struct.pack("<H", 4096), b"\x05") +
                            req(0x12, 0, struct.pack("<H", 4096)),
        "st_mixed": b"\x01" + req(0x01, 10, b"\x0f", b"\x01") + req(0x03, 65000, b"\xff", b"\x02") +
                    req(0x02, 65535, b"\x00") + req(0x12, -5, struct.pack("<H", 10)) +
                    req(0x0A, 0, b"\x03"),
        "st_big_write": b"\x01" + req(0x23, 0, struct.pack("<I", 65536), b"\x09") +
                        req(0x12, 65536 - 300, struct.pack("<H", 300)),
        "st_truncated": b"\x03" + struct.pack("<I", 5000)[:3] +
                        req(0x23, 4096, struct.pack("<I", 40000), b"\x11"),
        "st_raw_opcode": b"\x01" + req(0x41, 0, b"\x10", b"\x7f"),
    }
    # Small client buffers (mode bits 2-5): the target receives in pieces and blocks sending.
    structured["st_big_write_small_buffers"] = b"\x15" + structured["st_big_write"][1:]
    structured["st_pipeline_small_buffers"] = b"\x15" + b"".join(
        req(0x13, 4096 * i, struct.pack("<H", 4096), bytes([i])) for i in range(16)) + \
        req(0x22, 0, struct.pack("<I", 65536))
    write("fuzz_tcp_server", "raw_v2_pipeline_small_buffers", b"\x14" + raw["raw_v2_pipeline"])
    write("fuzz_tcp_session", "raw_v2_pipeline_small_buffers", b"\x14" + raw["raw_v2_pipeline"])
    for name, data in structured.items():
        write("fuzz_tcp_server", name, data)
        write("fuzz_tcp_session", name, data)


# ---------------------------------------------------------------- fuzz_shm_server
def shm():
    def item(g, off, length_bytes, extra=b""):
        return bytes([g]) + struct.pack("<i", off)[:3] + length_bytes + extra
    seeds = {
        # One request: WRITE 256 bytes, READ them back elsewhere.
        "write_read": b"\x00" + b"\x00\x01" + item(0x20, 0, b"\xff") + item(0x44, 0, struct.pack("<H", 256), struct.pack("<i", 4096)[:3]),
        # Several requests, mixed ops, one out of range, one in the no-remote buffer.
        "mixed": b"\x00" + b"\x00\x03" + item(0x24, 100, struct.pack("<H", 1000)) +
                 item(0x04, 65000, struct.pack("<H", 536)) + item(0x04, 65000, struct.pack("<H", 537)) +
                 item(0x22, 0, b"\x10") + b"\x00" + b"\x00" + item(0x00, -1, b"\x01"),
        "bad_initiator": b"\x00" + b"\x00\x01" + item(0x64, 0, struct.pack("<H", 4096), struct.pack("<i", -100)[:3]) +
                         item(0x40, 0, b"\x20", struct.pack("<i", 65530)[:3]),
        "raw_op": b"\x00" + b"\x00\x00" + item(0x10, 0, b"\x08", struct.pack("<I", 2)),
        "bad_hello_magic": b"\x04" + b"XXXX",
        "hello_refused": b"\x05" + b"\x00\x00" + item(0x20, 0, b"\x01"),
        "bad_count": b"\x00" + b"\x02" + struct.pack("<I", 2000) + item(0x20, 0, b"\x01"),
        "truncated": b"\x08" + struct.pack("<I", 50)[:3] + b"\x00\x00" + item(0x20, 0, b"\xff"),
    }
    # Map messages (f bit 3): memfds announced over SCM_RIGHTS, copied with memcpy.
    def slot_ioff(slot, off):
        return struct.pack("<I", (1 << 22) | (slot << 19) | off)[:3]
    def map_msg(ranges, f=0x08):  # ranges: (s byte, extra bytes)
        return bytes([f, len(ranges)]) + b"".join(bytes([b]) + extra + b"\x40" for b, extra in ranges)
    seeds["map_write_read"] = b"\x00" + map_msg([(0x00, b"")]) + b"\x00\x01" + \
        item(0x60, 0, b"\xff", slot_ioff(0, 0)) + item(0x44, 0, struct.pack("<H", 256), slot_ioff(0, 1024))
    seeds["map_two_then_vm"] = b"\x00" + map_msg([(0x03, b""), (0x0F, b"")]) + b"\x00\x02" + \
        item(0x64, 512, struct.pack("<H", 2048), slot_ioff(1, 60000)) + \
        item(0x20, 4096, b"\x7f") + item(0x44, 0, struct.pack("<H", 300), slot_ioff(0, 16000))
    seeds["map_clear_then_slot_vm"] = b"\x00" + map_msg([(0x01, b"")]) + map_msg([]) + b"\x00\x00" + \
        item(0x60, 0, b"\x3f", slot_ioff(0, 100))
    seeds["map_count_mismatch"] = b"\x00" + map_msg([(0x00, b"")], f=0x0A)[:2] + struct.pack("<I", 2) + \
        bytes([0x00, 0x40]) + b"\x00\x00" + item(0x60, 0, b"\x10", slot_ioff(0, 0))
    seeds["map_pipe"] = b"\x00" + map_msg([(0x40, b"")]) + b"\x00\x00" + item(0x20, 0, b"\x10")
    seeds["map_over_scratch"] = b"\x00" + map_msg([(0x21, struct.pack("<Q", SCRATCH))]) + b"\x00\x01" + \
        item(0x20, 0, b"\xff") + item(0x04, 100, struct.pack("<H", 8000))
    # Descriptors of the wrong kind (range byte bit 7, then a kind byte k), over the mapping
    # cap, too many, or on the wrong message or byte (see the top of fuzz_shm_server.cc).
    req = b"\x00\x00" + item(0x20, 0, b"\x10")
    seeds["map_unsealed"] = b"\x00" + map_msg([(0x80, b"\x00")]) + req
    seeds["map_huge_64tib"] = b"\x00" + map_msg([(0x80, bytes([1 | (16 << 2)]))]) + req
    seeds["map_sealed_then_huge"] = b"\x00" + map_msg([(0x00, b""), (0x80, b"\x01")]) + req
    seeds["map_regular_file"] = b"\x00" + map_msg([(0x80, b"\x02")]) + req
    seeds["map_eventfd"] = b"\x00" + map_msg([(0x80, b"\x03")]) + req
    seeds["map_extra_fds"] = b"\x00" + bytes([0x18, 1, 0x02]) + b"\x00\x40" + req
    seeds["map_fds_on_header_byte5"] = b"\x00" + bytes([0x28, 1, 0x04]) + b"\x00\x40" + \
        b"\x00\x01" + item(0x60, 0, b"\xff", slot_ioff(0, 0))
    seeds["map_fd_flood"] = b"\x00" + bytes([0x18, 0, 0x80]) + req
    # An export request (nothing to lend here: an empty loan), then a request; and one with
    # a count, which the target refuses by closing.
    seeds["export_then_request"] = b"\x00" + b"\x03" + struct.pack("<II", 0x5845434D, 0) + req
    seeds["export_with_count"] = b"\x00" + b"\x03" + struct.pack("<II", 0x5845434D, 1) + req
    seeds["request_with_fds"] = b"\x00" + b"\x10\x00\x02" + item(0x20, 0, b"\x10")
    seeds["request_fd_flood"] = b"\x00" + b"\x10\x00\x80" + item(0x20, 0, b"\x10")
    # Hello variants: a malformed proof message, a v1 hello, a proof address from the input.
    seeds["proof_bad_magic"] = b"\x03" + req
    seeds["hello_v1"] = b"\x07" + struct.pack("<IIQQ", 0x4853434D, 1, 0, 0) + req
    seeds["hello_raw_proof_addr"] = b"\x06" + struct.pack("<Q", SCRATCH) + req
    for name, data in seeds.items():
        write("fuzz_shm_server", name, data)


# ---------------------------------------------------------------- fuzz_real_client_wire
def real_client_wire():
    t = "fuzz_real_client_wire"
    cfg = ('{"device_names":"","host":"h","master_server_address":"127.0.0.1:50051",'
           '"metadata_server":"http://127.0.0.1:8080/metadata","protocol":"tcp",'
           '"segment_name":"h:12345"}')
    # Mode 0: the line a dummy decodes.
    write(t, "config_ok", b"\x00" + cfg.encode() + b"\n\n")
    write(t, "config_escapes", b"\x00" + cfg.replace('"h"', '"h\\u00e9\\"\\\\\\/"').encode() + b"\n")
    write(t, "config_empty_host", b"\x00" + cfg.replace('"h"', '""').encode() + b"\n")
    write(t, "config_not_string", b"\x00" + cfg.replace('"tcp"', '["tcp"]').encode() + b"\n")
    write(t, "config_missing", b"\x00" + b'{"host":"h"}\n')
    write(t, "config_extra_and_dup", b"\x00" + cfg[:-1].encode() + b',"x":{"y":[1,2]},"host":"i"}\n')
    write(t, "config_deep", b"\x00" + b"[" * 600 + b"]" * 600 + b"\n")
    write(t, "config_no_newline", b"\x00" + cfg.encode())
    # Mode 1: EncodeConfig of six fields.
    def fields(*fs):
        return b"\x01" + b"".join(bytes([len(f)]) + f for f in fs)
    write(t, "encode_ok", fields(b"m:1", b"http://x", b"tcp", b"", b"h", b"h:1"))
    write(t, "encode_controls", fields(b"m\n", b"\"\\", b"\x00\x1f\x7f", b"\xc3\xa9", b"h", b""))
    write(t, "encode_not_utf8", fields(b"m", b"x", b"", b"", b"h\xff", b""))
    # Mode 2: connections to a RealClientServer.
    hello = b"MOONCAKE-DUMMY 1\n"
    def conns(*streams):
        out = b"\x02" + bytes([len(streams) - 1])
        for st in streams[:-1]:
            out += struct.pack("<H", len(st)) + st
        return out + streams[-1]
    write(t, "server_hello", conns(hello))
    write(t, "server_hello_then_bytes", conns(hello + b"anything after the hello\n" * 3))
    write(t, "server_wrong_hello", conns(b"MOONCAKE-DUMMY 2\n"))
    write(t, "server_http", conns(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    write(t, "server_partial", conns(hello[:5]))
    write(t, "server_long_line", conns(b"M" * 65))
    write(t, "server_mixed", conns(hello, b"", b"junk\n", hello + hello))


# ---------------------------------------------------------------- fuzz_master_http
def master_http():
    t = "fuzz_master_http"
    def raw(target, gap=0, took=0):
        b = bytes([(gap & 7) | ((took & 7) << 3)])
        target = target.encode("latin1")
        if len(target) >= 255:
            b += b"\xff" + struct.pack("<H", len(target))
        else:
            b += bytes([len(target)])
        return b + target
    targets = [
        "/metrics", "/metrics/summary", "/health", "/role", "/ha_status", "/kv_events/status",
        "/get_all_keys",
        "/get_all_segments", "/query_segment?segment=seg-a", "/query_segment?segment=seg+b",
        "/query_segment?segment=nope", "/query_segment", "/query_key?key=k1",
        "/query_key?key=k+2", "/query_key?key=%2541", "/query_key?key=caf%C3%A9",
        "/query_key?key=x%FF", "/query_key?key=being+written", "/query_key?key=",
        "/query_key?key=%4", "/query_key?key=%zz", "/query_key?&&key=k1&key=nope",
        "/batch_query_keys?keys=k1,k+2,a%2Cb,nope,k1", "/batch_query_keys?keys=",
        "/batch_query_keys?a=1&keys=x%FF,caf%C3%A9&keys=k1", "/nope?x", "/metrics?x=%"]
    write(t, "direct_all", b"\x00" + b"".join(raw(x) for x in targets[:16]))
    write(t, "direct_all2", b"\x00" + b"".join(raw(x) for x in targets[16:]))
    write(t, "direct_throttle", b"\x00" + raw("/get_all_keys", 0, 4) + raw("/get_all_keys", 2) +
          raw("/query_key?key=k1") + raw("/metrics/summary", 5, 1) + raw("/get_all_segments"))
    # A batch of kMaxBatchItems keys (b = 0x06), and of one more, real keys (b = 0x0b): 400.
    write(t, "direct_batch_cap", b"\x00" + b"\x80\x06")
    write(t, "direct_batch_over", b"\x00" + b"\x80\x0b")
    write(t, "direct_batch_small", b"\x00" + b"\x80\x41" + b"\x80\xfc")
    write(t, "direct_long_key", b"\x00" + b"\xc0\x00" + b"\xc0\x01")
    def served(streams, b=None):
        out = b"\x01" + bytes([len(streams) - 1 if b is None else b])
        for st in streams[:-1]:
            out += struct.pack("<H", len(st)) + st
        return out + streams[-1]
    write(t, "served_get", served([b"GET /query_key?key=k1 HTTP/1.1\r\nHost: x\r\n\r\n"]))
    write(t, "served_three", served([b"HEAD /get_all_keys HTTP/1.1\r\n\r\n",
                                     b"POST /metrics HTTP/1.1\r\n\r\n",
                                     b"GET nope HTTP/1.0\r\n\r\n"]))
    write(t, "served_partial", served([b"GET /metrics HTTP/1.1\r\nHost:"]))
    write(t, "served_body", served([b"GET /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"]))
    write(t, "served_no_version", served([b"GET /health\r\n\r\n", b"GET  HTTP/1.1\r\n\r\n"]))
    write(t, "served_414", served([b"GET /" + b"a" * 100], b=0x80))
    write(t, "served_431", served([b"GET / HTTP/1.1\r\nX: "], b=0x81))


# ---------------------------------------------------------------- fuzz_metadata_http
def metadata_http():
    t = "fuzz_metadata_http"
    def put(k, value):
        return bytes([1 | (k << 3), len(value)]) + value
    def op(o, k):
        return bytes([o | (k << 3)])
    # k: a, %61, rpc_meta_1, b+rpc_meta, (empty), (none), +++, 200 x L
    write(t, "put_get_delete", b"\x01" + op(0, 1) + put(0, b"abc") + op(0, 1) + op(2, 0) +
          op(0, 0) + op(5, 0))
    write(t, "rpc_meta_rules", b"\x01" + put(2, b"x") + put(2, b"x") + put(2, b"y") +
          put(3, b"z") + op(0, 3) + op(2, 2))
    write(t, "bad_keys_methods", b"\x01" + op(0, 4) + op(1, 5) + b"\x00" + op(2, 6) + op(3, 0) +
          op(4, 2) + put(7, b"long"))
    write(t, "over_limits", b"\x01" + bytes([1, 255]) + put(0, b"v" * 250) + put(2, b"w" * 250) +
          put(3, b"u" * 250) + put(7, b"t" * 250) + put(0, b"s" * 250))
    write(t, "raw_get", b"\x00GET /metadata?key=a HTTP/1.1\r\nHost: x\r\n\r\n"
          b"GET /health HTTP/1.1\r\n\r\n")
    write(t, "raw_garbage", b"\x00\x16\x03\x01\x00\xa5GET / HTTP/9.9\r\n\r\n")
    write(t, "raw_chunked", b"\x00DELETE /metadata?key=a HTTP/1.1\r\nTransfer-Encoding: chunked"
          b"\r\n\r\nffffffffffffffff\r\nxx\r\n0\r\n\r\n")


def pb_varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def pb_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def pb_uint(field, v):
    return pb_varint(field << 3) + pb_varint(v)


def rpc_frame(method, seq, payload, announced=None):
    """src/store/rpc/rpc_wire.h: 'MCR1', u16 method, u16 status, u32 seq, u32 length."""
    n = len(payload) if announced is None else announced
    return b"MCR1" + struct.pack("<HHII", method, 0, seq, n) + payload


def master_rpc():
    """fuzz_master_rpc: byte 0 picks 1..3 connections (0: one, taking the rest)."""
    t = "fuzz_master_rpc"
    ping = rpc_frame(1, 1, pb_bytes(1, "fuzz-client"))
    keys = pb_bytes(1, "fuzz-client") + pb_bytes(2, "k1") + pb_bytes(2, "k2")
    put_start = rpc_frame(4, 2, pb_bytes(1, "fuzz-client") +
                          pb_bytes(2, pb_bytes(1, "k1") + pb_uint(2, 4096)) +
                          pb_bytes(2, pb_bytes(1, "k2") + pb_uint(2, 100)) +
                          pb_bytes(3, pb_uint(1, 1)))
    put_end = rpc_frame(5, 3, keys)
    get = rpc_frame(7, 4, keys)
    exist = rpc_frame(8, 5, keys)
    remove = rpc_frame(9, 6, keys + pb_uint(3, 1))
    remove_all = rpc_frame(11, 7, pb_bytes(1, "fuzz-client") + pb_uint(3, 1))
    regex = rpc_frame(10, 8, pb_bytes(1, "fuzz-client") + pb_bytes(2, "^k.*") + pb_uint(3, 1))
    stats = rpc_frame(13, 9, b"")
    write(t, "ping", b"\x00" + ping)
    write(t, "put_get_remove", b"\x00" + put_start + put_end + get + exist + remove + stats)
    write(t, "slow_then_fast", b"\x00" + put_start + put_end + remove_all + ping + regex + stats)
    write(t, "unknown_method", b"\x00" + rpc_frame(200, 1, b"x") + ping)
    write(t, "bad_payload", b"\x00" + rpc_frame(4, 1, b"\xff\xff\xff") + ping)
    write(t, "too_large", b"\x00" + ping + rpc_frame(1, 2, b"", announced=0x7FFFFFFF) + ping)
    write(t, "foreign", b"\x00" + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + ping)
    write(t, "partial", b"\x00" + ping + rpc_frame(1, 2, b"", announced=1000) + b"abc")
    first = put_start + put_end
    write(t, "two_connections", b"\x01" + struct.pack("<H", len(first)) + first + get + remove)
    write(t, "three_connections", b"\x02" + struct.pack("<H", len(ping)) + ping +
          struct.pack("<H", len(stats)) + stats + remove_all)


GENERATED = ["fuzz_handshake_frame", "fuzz_segment_desc", "fuzz_tcp_server", "fuzz_tcp_session",
             "fuzz_shm_server", "fuzz_real_client_wire", "fuzz_master_http", "fuzz_metadata_http",
             "fuzz_master_rpc"]

if __name__ == "__main__":
    # Only the corpora written here (fuzz_master_service's and fuzz_auth_exchange's seeds
    # are not generated by this script and stay).
    for t in GENERATED:
        if os.path.isdir(os.path.join(CORPUS, t)):
            shutil.rmtree(os.path.join(CORPUS, t))
    handshake()
    segment_desc()
    tcp()
    shm()
    real_client_wire()
    master_http()
    metadata_http()
    master_rpc()
    for t in sorted(os.listdir(CORPUS)):
        print(t, len(os.listdir(os.path.join(CORPUS, t))))
