#!/usr/bin/env python3
"""HTTP metadata server for Mooncake: upstream's ``mooncake.http_metadata_server``, stdlib only.

A key-value store behind the transfer engine's HTTP metadata protocol, an alternative to etcd
(``MC_METADATA_SERVER=http://<host>:<port>/metadata``)::

    python -m mooncake.http_metadata_server [--host 0.0.0.0] [--port 8080] [--log-level INFO]

Route ``/metadata`` with the key in the query (``?key=...``; surrounding whitespace is dropped):

- ``GET``: 200 and the stored bytes, or 404 ``metadata not found``.
- ``PUT``: 200 ``metadata updated`` (the body is the value). Re-putting an existing key that
  contains ``rpc_meta`` with a different value is 400 ``Duplicate rpc_meta key not allowed``;
  the identical value is accepted (200 ``metadata unchanged``), as this project's C++ server
  does, so that an engine that restarts with the same address is not refused.
- ``DELETE``: 200 ``metadata deleted``, or 404 ``metadata not found``.
- No or blank key: 400 ``metadata key is required``; other methods 405; other paths 404.

Every reply is ``application/json``, as upstream's. Unlike upstream's (aiohttp), this one is
bounded: a request head (line and headers) is at most 8 KiB (431 past it) and must arrive within
``head_timeout`` seconds, a body at most ``max_body_bytes`` (413) and within ``body_timeout``;
bodies being received hold at most ``max_inflight_body_bytes`` together (503 past it); the stored
keys and values at most ``max_total_bytes`` (507); at most ``max_connections`` connections are
open (more are answered 503 and closed); an idle keep-alive connection is closed after
``keep_alive_timeout`` seconds. The port is bound without SO_REUSEPORT: a port in use is refused.

Shared secret: this server does **not** check ``MC_AUTH_SECRET``. Anyone who reaches it may PUT or
DELETE any key, even when the engines have a secret (their entries are signed, so a substituted
one is refused by readers: a denial of service, never a redirection). The proof headers that
engines with a secret send (``X-MC-Auth-*``) are ignored. For writes limited to holders of the
secret, run the C++ ``mooncake_http_metadata_server`` with ``MC_AUTH_SECRET`` (docs/wire_protocol.md
§5.5).

``KVBootstrapServer`` keeps upstream's interface: ``run()`` (serves on a thread of its own),
``close()``, ``poll()``, the ``store`` dict (key -> bytes) and the coroutine
``_handle_metadata(request)``, which takes an object with ``method``, ``query`` (a mapping) and
``async read()``, and returns a ``Response`` (``status``, ``body``, ``content_type``, ``text``).
"""

import argparse
import asyncio
import logging
import signal
import sys
import threading
import urllib.parse
from enum import Enum
from typing import Dict, Mapping, Optional, Tuple

__all__ = ["KVPoll", "KVBootstrapServer", "Response", "main"]

_LOG = logging.getLogger("mooncake.http_metadata_server")

MAX_HEAD_BYTES = 8192
_REASONS = {200: "OK", 100: "Continue", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Payload Too Large", 431: "Request Header Fields Too Large",
            501: "Not Implemented", 503: "Service Unavailable", 507: "Insufficient Storage"}


class KVPoll(Enum):
    """Status of the KV server."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class Response:
    """A reply: ``status``, ``body`` (bytes), ``content_type``."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        self.status = status
        self.body = body
        self.content_type = content_type

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.body[:60]!r})"


def _reply(status: int, text: str) -> Response:
    return Response(status, text.encode())


class _Request:
    def __init__(self, method: str, query: Mapping[str, str], body: bytes):
        self.method = method
        self.query = query
        self._body = body

    async def read(self) -> bytes:
        return self._body


class _HttpError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


class KVBootstrapServer:
    """HTTP server for storing and retrieving metadata."""

    def __init__(self, port: int, host: str = "0.0.0.0", *,
                 max_body_bytes: int = 16 << 20, max_total_bytes: int = 1 << 30,
                 max_inflight_body_bytes: int = 256 << 20, max_connections: int = 1024,
                 head_timeout: float = 3.0, body_timeout: float = 60.0,
                 keep_alive_timeout: float = 5.0):
        """``port`` 0 takes a free port; after ``run()``, ``port`` is the bound one."""
        self.port = port
        self.host = host
        self.store: Dict[str, bytes] = {}
        self.lock = threading.Lock()  # guards store and the byte counts (any thread, any loop)
        self.max_body_bytes = max_body_bytes
        self.max_total_bytes = max_total_bytes
        self.max_inflight_body_bytes = max_inflight_body_bytes
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.error: Optional[BaseException] = None  # why run() could not serve
        self.thread: Optional[threading.Thread] = None
        self._total_bytes = 0
        self._inflight = 0
        self._connections = 0
        self._writers = set()  # open connections (the loop's thread only)
        self._refusing = 0  # connections over max_connections being answered 503
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._ready = threading.Event()

    # ---- upstream's interface ----

    def run(self) -> threading.Thread:
        """Start the server in a background thread; returns once it listens (or failed)."""
        self.thread = threading.Thread(target=self._run_server, daemon=True,
                                       name="mooncake-http-metadata")
        self.thread.start()
        self._ready.wait(10)
        if self.error is None:
            _LOG.info("HTTP Metadata Server started on %s:%d", self.host, self.port)
        return self.thread

    def close(self) -> None:
        """Shut the server down (open connections are closed)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=5)

    def poll(self) -> KVPoll:
        """Success while serving, else Failed."""
        if self.thread is None or not self.thread.is_alive() or self.error is not None:
            return KVPoll.Failed
        return KVPoll.Success

    async def _handle_metadata(self, request) -> Response:
        """One /metadata request: GET, PUT or DELETE of ``request.query['key']``."""
        key = (request.query.get("key", "") or "").strip()
        if not key:
            return _reply(400, "metadata key is required")
        if request.method == "GET":
            with self.lock:
                value = self.store.get(key)
            if value is None:
                return _reply(404, "metadata not found")
            return Response(200, value)
        if request.method == "PUT":
            data = bytes(await request.read())
            with self.lock:
                old = self.store.get(key)
                if old is not None and "rpc_meta" in key:
                    if old == data:
                        return _reply(200, "metadata unchanged")
                    return _reply(400, "Duplicate rpc_meta key not allowed")
                old_bytes = 0 if old is None else len(key) + len(old)
                total = self._total_bytes - old_bytes + len(key) + len(data)
                if total > self.max_total_bytes:
                    return _reply(507, "metadata store is full")
                self._total_bytes = total
                self.store[key] = data
            return _reply(200, "metadata updated")
        if request.method == "DELETE":
            with self.lock:
                old = self.store.pop(key, None)
                if old is None:
                    return _reply(404, "metadata not found")
                self._total_bytes -= len(key) + len(old)
            return _reply(200, "metadata deleted")
        return _reply(405, "Method not allowed")

    # ---- the HTTP/1.1 server ----

    def _run_server(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported through poll() / error
            self.error = e
            _LOG.error("Server error: %s", e)
        finally:
            self._ready.set()
            loop.close()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, self.host, self.port,
                                            limit=MAX_HEAD_BYTES, reuse_address=True,
                                            backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        # Connections still open are cut; their handlers then end by themselves.
        for w in list(self._writers):
            w.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=2)
            for t in late:
                t.cancel()
        try:
            await asyncio.wait_for(server.wait_closed(), 2)
        except asyncio.TimeoutError:
            pass

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if self._connections >= self.max_connections:
            await self._send(writer, _reply(503, "too many connections"), close=True)
            if self._refusing < 64:  # a flood is closed at once
                self._refusing += 1
                try:
                    await self._drain_and_close(reader, writer)
                finally:
                    self._refusing -= 1
            writer.close()
            return
        self._connections += 1
        self._writers.add(writer)
        try:
            first = True
            while True:
                timeout = self.head_timeout if first else self.keep_alive_timeout
                first = False
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
                except (asyncio.LimitOverrunError, ValueError):
                    await self._send(writer, _reply(431, "request head over 8192 bytes"),
                                     close=True)
                    await self._drain_and_close(reader, writer)
                    return
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    keep_alive = await self._request(head, reader, writer)
                except _HttpError as e:
                    await self._send(writer, _reply(e.status, e.text), close=True)
                    await self._drain_and_close(reader, writer)
                    return
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                if not keep_alive:
                    return
        finally:
            self._connections -= 1
            self._writers.discard(writer)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    @staticmethod
    async def _drain_and_close(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        """After an error reply: reads (and drops) what the client still sends, for at most
        0.2 s and 64 KiB, so that closing with unread bytes does not reset the connection
        before the client has read the reply."""
        try:
            if writer.can_write_eof():
                writer.write_eof()
            deadline = asyncio.get_running_loop().time() + 0.2
            dropped = 0
            while dropped < (64 << 10):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                data = await asyncio.wait_for(reader.read(65536), left)
                if not data:
                    break
                dropped += len(data)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        writer.close()

    @staticmethod
    def _parse_head(head: bytes) -> Tuple[str, str, str, Dict[str, str]]:
        try:
            text = head.decode("latin-1")
            lines = text.split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise _HttpError(400, "malformed request line") from None
        if not version.startswith("HTTP/1.") or not target.startswith("/"):
            raise _HttpError(400, "malformed request line")
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise _HttpError(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        return method, target, version, headers

    async def _request(self, head: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> bool:
        """Serves one request; whether the connection stays open."""
        method, target, version, headers = self._parse_head(head)
        conn = headers.get("connection", "").lower()
        keep_alive = conn != "close" and (version != "HTTP/1.0" or conn == "keep-alive")
        body = await self._read_body(method, headers, reader, writer)
        path, _, query = target.partition("?")
        if path != "/metadata":
            response = Response(404, b"404: Not Found", "text/plain")
        else:
            params = {}
            for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
                params.setdefault(name, value)
            response = await self._handle_metadata(_Request(method, params, body))
        await self._send(writer, response, close=not keep_alive, head_only=method == "HEAD")
        return keep_alive

    async def _read_body(self, method: str, headers: Dict[str, str],
                         reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        te = headers.get("transfer-encoding", "").lower()
        length_text = headers.get("content-length")
        if te not in ("", "identity", "chunked"):
            raise _HttpError(501, f"transfer-encoding {te} is not supported")
        if te != "chunked" and length_text is None:
            return b""
        if te != "chunked":
            if not length_text.isdigit():
                raise _HttpError(400, "bad content-length")
            length = int(length_text)
            if length > self.max_body_bytes:
                raise _HttpError(413, f"body over {self.max_body_bytes} bytes")
        else:
            length = 0
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        reserved = 0
        try:
            if te != "chunked":
                reserved = self._reserve(length)
                return await asyncio.wait_for(reader.readexactly(length), self.body_timeout)
            chunks = []
            deadline = asyncio.get_running_loop().time() + self.body_timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                line = await asyncio.wait_for(reader.readuntil(b"\r\n"), max(left, 0))
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _HttpError(400, "bad chunk size") from None
                if size == 0:
                    while (await asyncio.wait_for(reader.readuntil(b"\r\n"), max(left, 0))
                           != b"\r\n"):
                        pass  # trailers
                    return b"".join(chunks)
                if reserved + size > self.max_body_bytes:
                    raise _HttpError(413, f"body over {self.max_body_bytes} bytes")
                reserved += self._reserve(size)
                data = await asyncio.wait_for(reader.readexactly(size + 2), max(left, 0))
                if data[-2:] != b"\r\n":
                    raise _HttpError(400, "bad chunk")
                chunks.append(data[:-2])
        except (asyncio.LimitOverrunError, ValueError):
            raise _HttpError(400, "bad chunked body") from None
        finally:
            with self.lock:
                self._inflight -= reserved

    def _reserve(self, n: int) -> int:
        with self.lock:
            if self._inflight + n > self.max_inflight_body_bytes:
                raise _HttpError(503, "too many bodies being received; retry")
            self._inflight += n
        return n

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, r: Response, close: bool,
                    head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {r.status} {_REASONS.get(r.status, 'Status')}\r\n"
                f"Content-Type: {r.content_type}\r\nContent-Length: {len(r.body)}\r\n"
                f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode()
        try:
            writer.write(head if head_only else head + r.body)
            await writer.drain()
        except ConnectionError:
            pass


def parse_args(argv=None):
    """Parse command line arguments."""
    parser = argparse.ArgumentParser(description="HTTP Metadata Server for Mooncake",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--port", type=int, default=8080, help="Port to listen on")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Host to bind to")
    parser.add_argument("--log-level", type=str,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        default="INFO", help="Logging level")
    parser.add_argument("--max-body-bytes", type=int, default=16 << 20,
                        help="Largest value a PUT may store")
    parser.add_argument("--max-total-bytes", type=int, default=1 << 30,
                        help="Bytes of keys and values the server holds at most")
    parser.add_argument("--max-connections", type=int, default=1024,
                        help="Connections open at once")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be 0..65535")
    return args


def main(argv=None) -> int:
    """Entry point of ``python -m mooncake.http_metadata_server``."""
    args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    server = KVBootstrapServer(port=args.port, host=args.host,
                               max_body_bytes=args.max_body_bytes,
                               max_total_bytes=args.max_total_bytes,
                               max_connections=args.max_connections)
    server.run()
    if server.poll() != KVPoll.Success:
        print(f"mooncake.http_metadata_server: cannot listen on {args.host}:{args.port}: "
              f"{server.error}", file=sys.stderr)
        return 1
    print(f"mooncake.http_metadata_server listening on {args.host}:{server.port}", flush=True)

    stop = threading.Event()

    def signal_handler(sig, frame):
        stop.set()

    signal.signal(signal.SIGINT, signal_handler)
    signal.signal(signal.SIGTERM, signal_handler)
    while not stop.wait(0.5):
        if server.poll() != KVPoll.Success:
            print(f"mooncake.http_metadata_server: stopped: {server.error}", file=sys.stderr)
            return 1
    logging.info("Shutting down...")
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
