"""A fake target that answers the handshake but never completes a transfer.

Usage: stall_peer.py. Prints "ready <segment> <addr> <size>". Its descriptor (upstream's tcp
format) lists one buffer at a made-up address and a TCP data port that accepts connections,
reads everything sent to it, and never answers: every transfer to it stalls until the
initiator gives up. Runs until stdin closes.
"""
import json
import socket
import struct
import sys
import threading

ADDR, SIZE = 0x7F0000000000, 1 << 20


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def serve_handshake(listener, segment, data_port):
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                length = struct.unpack("<Q", recv_exact(conn, 8))[0]
                body = recv_exact(conn, length)
            except (ConnectionError, OSError):
                continue
            kind = body[0]
            if kind == 1:
                reply = {"buffers": [{"addr": ADDR, "length": SIZE, "name": segment}],
                         "name": segment, "protocol": "tcp", "rdma_server_name": "",
                         "tcp_data_host": "127.0.0.1", "tcp_data_port": data_port,
                         "tcp_proto_version": 2}
            elif kind == 2:
                reply = {"name": "", "notify_msg": "success"}
            else:
                reply = {"status": "success"}
            payload = bytes([kind]) + (json.dumps(reply) + "\n").encode()
            conn.sendall(struct.pack("<Q", len(payload)) + payload)


def swallow(conn):
    with conn:
        while conn.recv(1 << 16):
            pass


def serve_data(listener):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=swallow, args=(conn,), daemon=True).start()


def main():
    rpc, data = socket.socket(), socket.socket()
    for s in (rpc, data):
        s.bind(("127.0.0.1", 0))
        s.listen(16)
    segment = f"127.0.0.1:{rpc.getsockname()[1]}"
    threading.Thread(target=serve_handshake, args=(rpc, segment, data.getsockname()[1]),
                     daemon=True).start()
    threading.Thread(target=serve_data, args=(data,), daemon=True).start()
    print(f"ready {segment} {ADDR} {SIZE}", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
