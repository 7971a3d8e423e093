"""A bounded HTTP/1.1 server for the exporter: asyncio connections, h11 framing, small pools.

prometheus_client's server starts an unbounded thread per request and sets no timeouts.
Here connections live on one event loop and h11 parses requests and frames responses
(Host on HTTP/1.1, Content-Length syntax, HEAD without a body, Connection semantics).
What this module adds are the limits:

- every open socket counts against max_connections, from accept (TLS handshake included)
  until the socket is really closed; at the cap the longest-idle kept-alive connection is
  evicted (then the oldest one without a request head, then the longest-blocked writer),
  so idle or silent clients cannot lock a scrape out;
- beyond max_pending connections waiting for their first request head (TLS handshake
  included), the oldest is evicted once it has been silent for PENDING_GRACE: silent
  clients cannot hold more than that for long, a burst of real clients is not cut;
- the TLS handshake and the first request head must arrive within the read-header timeout,
  a kept-alive connection may idle for the idle timeout, a response that the peer does not
  read within the write timeout aborts the connection;
- heads over 16 KiB get 431, bodies over 64 KiB 413;
- basic auth's bcrypt runs on a few dedicated threads with a short queue (429 beyond);
  repeated credentials are answered from the authenticator's caches on the loop, and
  scrapes that send the same credentials while they are being checked wait for that one check;
- at most max_requests scrapes of the telemetry path run at once (503 beyond); the other
  routes are answered on the loop (they cost nothing).

SIGTERM/SIGINT (serve.py): stop accepting, close idle connections, drop queued password
checks, let in-flight requests finish within the grace, close the rest.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import base64
import binascii
import logging
import os
import socket
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11

from ..logs import fields
from .routes import Request, Response, Route, Router, decode_path, origin_form, plain
from .web_config import WebConfigSource

MAX_CONNECTIONS = 512
MAX_PENDING = 64  # connections without a complete request head yet (TLS handshake included)
# beyond MAX_PENDING only connections silent this long are evicted: a burst of new clients
# (each sends its head within a round trip or two) must not evict one another
PENDING_GRACE = 1.0
READ_CHUNK = 8192
# the shortest refresh deadline a scrape can ask for: below this a refresh cannot succeed
MIN_DEADLINE = 0.25
# bcrypt is CPU-bound (it releases the GIL): leave a core to the loop and the scrapes
BCRYPT_WORKERS = max(1, min(4, (os.cpu_count() or 2) // 2))
BCRYPT_QUEUE = BCRYPT_WORKERS * 2  # password checks running or waiting; 429 beyond
# how long a request waits for a changed web config to be read before it goes on with the old
CONFIG_WAIT = 1.0
CONFIG_RECHECK = 0.5  # kept-alive requests re-check the files at most this often
# TLS read buffer per connection: asyncio's default is 256 KiB, allocated (and zeroed) up
# front for each connection; one TLS record is at most 16 KiB (plus overhead).
TLS_READ_BUFFER = 32 * 1024
# client-side socket and TLS noise: logged at debug; anything else in the loop is a bug
_CLIENT_NOISE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, ssl.SSLError, ssl.CertificateError)
_CLIENT_GONE = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError, h11.ProtocolError)


@dataclass(frozen=True)
class Limits:
    max_requests: int = 40  # 0: no limit (the pool then has 64 threads)
    read_header_timeout: float = 10.0
    idle_timeout: float = 120.0
    write_timeout: float = 30.0
    max_header_bytes: int = 16384
    max_body_bytes: int = 65536
    timeout_offset: float = 0.5
    collect_timeout: float = 5.0
    max_connections: int = MAX_CONNECTIONS
    max_pending: int = MAX_PENDING


class _Reject(Exception):
    """Answer with this status and close the connection."""

    def __init__(self, status: HTTPStatus, detail: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail or status.phrase


class _Conn:
    """One open socket, for the cap and eviction. state: new (no request head yet), idle
    (kept alive between requests), busy (a request is being answered), writing (its
    response is being flushed)."""

    __slots__ = ("writer", "state", "since", "waiting")

    def __init__(self, writer: asyncio.StreamWriter, now: float) -> None:
        self.writer = writer
        self.state = "new"
        self.since = now
        self.waiting: asyncio.Future[None] | None = None  # see HttpServer._first_bytes

    def set(self, state: str, now: float) -> None:
        self.state, self.since = state, now

    def abort(self) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()
        self.writer.transport.abort()


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header[:6].lower() == "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if sep else None


def _standalone(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A complete 'Connection: close' response framed by h11 when the connection's own h11
    state cannot send one (no request was parsed, e.g. a head that timed out)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.next_event()
    out = conn.send(h11.Response(status_code=status, headers=headers + [("Connection", "close")], reason=_reason(status)))
    return (out or b"") + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _head_size(event: h11.Request) -> int:
    return len(event.method) + len(event.target) + 12 + sum(len(k) + len(v) + 4 for k, v in event.headers)


class HttpServer:
    def __init__(self, router: Router, web: WebConfigSource, limits: Limits, log: logging.Logger) -> None:
        self._router = router
        self._web = web
        self._limits = limits
        self._log = log
        # scrapes only: the other routes are answered on the loop
        self._pool = ThreadPoolExecutor(max_workers=(limits.max_requests or 64), thread_name_prefix="resmon-http")
        self._bcrypt = ThreadPoolExecutor(max_workers=BCRYPT_WORKERS, thread_name_prefix="resmon-auth")
        self._config_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resmon-config")
        self._refreshing: asyncio.Future[None] | None = None
        self._last_refresh = 0.0
        self._conns: dict[_Conn, None] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # connection handlers, awaited at shutdown
        self._active = 0  # requests being answered
        self._scrapes = 0  # of which on the telemetry path
        self._checks = 0  # password checks running or queued
        self._closing = False
        self._server: asyncio.base_events.Server | None = None
        self._drained: asyncio.Event | None = None

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """Bind (OSError when the address is taken) and return every bound address."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._route_asyncio_log()
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER  # type: ignore[attr-defined]
        self._drained = asyncio.Event()
        self._server = await asyncio.start_server(
            self._accept, host or None, port, limit=self._limits.max_header_bytes, reuse_address=True, backlog=256
        )
        return [s.getsockname() for s in self._server.sockets]

    def _route_asyncio_log(self) -> None:
        # asyncio's own warnings (TLS clients misbehaving) in our format, never raw on stderr
        asyncio_log = logging.getLogger("asyncio")
        asyncio_log.handlers[:] = list(self._log.handlers)
        asyncio_log.propagate = False
        asyncio_log.setLevel(max(self._log.getEffectiveLevel(), logging.WARNING))

    async def shutdown(self, grace: float) -> bool:
        """Stop accepting; drop queued password checks; wait up to grace seconds for
        in-flight requests; close the rest. False when requests were still running."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        self._bcrypt.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._conns):
            if conn.state in ("new", "idle"):
                conn.abort()
        drained = True
        if self._active and self._drained is not None:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), grace)
            except asyncio.TimeoutError:
                self._log.warning("requests still running at shutdown", extra=fields(requests=self._active))
                drained = False
        for conn in list(self._conns):
            conn.abort()
        if self._tasks:  # let the aborted connections finish rather than be cancelled at exit
            await asyncio.wait(list(self._tasks), timeout=1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._config_pool.shutdown(wait=False, cancel_futures=True)
        return drained

    async def reload(self) -> None:
        """SIGHUP: re-read the web config now (logged: reloaded, or the error)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._config_pool, self._web.refresh, True)
        except RuntimeError:  # the pool is shut down: we are exiting
            pass

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message") or "")
        client = "transport" in context or "protocol" in context
        if isinstance(exc, (*_CLIENT_NOISE, asyncio.CancelledError)) or (isinstance(exc, TimeoutError) and client):
            # CancelledError: a connection task cancelled as the loop closes
            self._log.debug("connection error", extra=fields(error=f"{exc.__class__.__name__}: {exc}"))
            return
        error = f"{exc.__class__.__name__}: {exc}" if exc is not None else message
        self._log.error(
            "unhandled error in the event loop",
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
            extra=fields(error=error, context=message),
        )

    # -- the web config, read off the loop ------------------------------------------------

    async def _refresh_web(self, per_request: bool) -> None:
        if not self._web.watched:
            return
        loop = asyncio.get_running_loop()
        if per_request and loop.time() - self._last_refresh < CONFIG_RECHECK:
            return
        if self._refreshing is None or self._refreshing.done():
            self._last_refresh = loop.time()
            try:
                self._refreshing = loop.run_in_executor(self._config_pool, self._web.refresh)
            except RuntimeError:  # shut down
                return
        try:
            await asyncio.wait_for(asyncio.shield(self._refreshing), CONFIG_WAIT)
        except asyncio.TimeoutError:
            pass  # a slow file system: serve with the config in force
        except Exception as exc:
            self._log.error("web config check failed", extra=fields(error=f"{exc.__class__.__name__}: {exc}"))

    # -- connections --------------------------------------------------------------------

    def _make_room(self, now: float) -> bool:
        """Evict so that one more connection fits; False when nothing can be evicted."""
        limits = self._limits
        pending = [c for c in self._conns if c.state == "new"]
        if len(pending) >= limits.max_pending:
            oldest = min(pending, key=lambda c: c.since)
            if now - oldest.since >= PENDING_GRACE:
                self._evict(oldest)
        if len(self._conns) < limits.max_connections:
            return True
        for state in ("idle", "new", "writing"):
            candidates = [c for c in self._conns if c.state == state]
            if candidates:
                self._evict(min(candidates, key=lambda c: c.since))
                return True
        return False  # every socket is answering a request: those are bounded by the pools

    def _evict(self, conn: _Conn) -> None:
        self._conns.pop(conn, None)  # its socket closes on the loop's next turn
        conn.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if self._web.tls_enabled:
            # the ClientHello must reach the TLS layer, not the plain stream: read nothing
            # until start_tls (which resumes reading) while the config check runs
            writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport
        conn = _Conn(writer, loop.time())
        if self._closing or not self._make_room(conn.since):
            writer.transport.abort()
            return
        self._conns[conn] = None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(conn, reader, writer)
        except _CLIENT_GONE:
            pass  # the client went away or stalled: nothing to answer
        finally:
            await self._close(writer)
            self._conns.pop(conn, None)
            if task is not None:
                self._tasks.discard(task)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        # counted until really closed; a peer that does not read cannot hold the close open
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (Exception, asyncio.TimeoutError):
            writer.transport.abort()

    async def _first_bytes(self, conn: _Conn, timeout: float) -> bool:
        """Wait, reading nothing, until the client sends something (its ClientHello): a
        silent connection then holds no TLS state (asyncio allocates its buffers at
        start_tls). The paused transport owns the socket's fd in the loop, so a duplicate
        fd is watched. False: silent until the timeout, or evicted."""
        sock = conn.writer.get_extra_info("socket")
        try:
            watched = socket.socket(fileno=os.dup(sock.fileno()))
        except (OSError, AttributeError, ValueError):
            return True  # no spare fd: go straight to the handshake
        fd = watched.fileno()
        loop = asyncio.get_running_loop()
        conn.waiting = loop.create_future()
        waiting = conn.waiting
        def readable() -> None:
            if not waiting.done():
                waiting.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(waiting, max(timeout, 0.0))
            try:  # a client that just closed needs no handshake either
                return bool(watched.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except BlockingIOError:
                return True
            except OSError:
                return False
        except asyncio.TimeoutError:
            return False
        except asyncio.CancelledError:
            if not waiting.cancelled():
                raise
            return False  # evicted (or the task cancelled at exit: it ends either way)
        finally:
            loop.remove_reader(fd)
            watched.close()
            conn.waiting = None

    async def _start_tls(self, writer: asyncio.StreamWriter, ctx: ssl.SSLContext, timeout: float) -> bool:
        # Per connection, with the context as it is now: a rotated certificate applies at once.
        timeout = max(timeout, 0.001)
        try:
            if sys.version_info >= (3, 11):
                await asyncio.wait_for(writer.start_tls(ctx, ssl_handshake_timeout=timeout), timeout + 1)
            else:  # pragma: no cover - Python 3.10
                loop = asyncio.get_running_loop()
                protocol = writer.transport.get_protocol()
                transport = await asyncio.wait_for(
                    loop.start_tls(writer.transport, protocol, ctx, server_side=True, ssl_handshake_timeout=timeout),
                    timeout + 1,
                )
                writer._transport = transport  # type: ignore[attr-defined]
                protocol._stream_writer = writer  # type: ignore[attr-defined]
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            self._log.debug("TLS handshake failed", extra=fields(error=str(exc) or exc.__class__.__name__))
            return False
        return True

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        limits = self._limits
        # the TLS handshake and the first request head share the read-header timeout
        head_deadline = conn.since + limits.read_header_timeout
        await self._refresh_web(per_request=False)
        _, ctx, _ = self._web.current()
        if ctx is not None:
            if not await self._first_bytes(conn, head_deadline - loop.time()):
                return
            if not await self._start_tls(writer, ctx, head_deadline - loop.time()):
                return
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        first = True
        while not self._closing:
            try:
                request = await self._read_request(h, reader, conn, first, head_deadline)
            except _Reject as rej:
                await self._send(writer, self._reject_bytes(h, rej))
                return
            except h11.RemoteProtocolError as exc:
                status = HTTPStatus(exc.error_status_hint)
                await self._send(writer, self._reject_bytes(h, _Reject(status, str(exc) or status.phrase)))
                return
            if request is None:
                return
            first = False
            conn.set("busy", loop.time())
            self._active += 1
            try:
                response = await self._answer(request)
            finally:
                self._active -= 1
                if self._active == 0 and self._drained is not None:
                    self._drained.set()
            config, _, _ = self._web.current()
            headers = list(response.headers) + list(config.headers)
            headers.append(("Content-Length", str(len(response.body))))
            if self._closing:
                headers.append(("Connection", "close"))
            data = h.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
            if request.method != "HEAD":  # HEAD: the same headers, no body
                data = (data or b"") + (h.send(h11.Data(data=response.body)) or b"")
            data = (data or b"") + (h.send(h11.EndOfMessage()) or b"")
            conn.set("writing", loop.time())
            if not await self._send(writer, data):
                return
            if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                return  # close (h11 decided: Connection: close, HTTP/1.0, an error)
            h.start_next_cycle()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        writer.write(data)
        try:
            await asyncio.wait_for(writer.drain(), self._limits.write_timeout)
        except asyncio.TimeoutError:
            writer.transport.abort()  # the peer does not read: free the socket and its buffers now
            return False
        except (OSError, ssl.SSLError):
            return False
        return True

    def _reject_bytes(self, h: h11.Connection, rej: _Reject) -> bytes:
        response = plain(rej.status.value, f"{rej.status.value} {rej.detail}")
        headers = list(response.headers) + [("Content-Length", str(len(response.body))), ("Connection", "close")]
        try:
            data = h.send(h11.Response(status_code=rej.status.value, headers=headers, reason=_reason(rej.status.value)))
            data = (data or b"") + (h.send(h11.Data(data=response.body)) or b"") + (h.send(h11.EndOfMessage()) or b"")
            return data
        except h11.LocalProtocolError:  # no request parsed on this connection's h11 state
            return _standalone(rej.status.value, list(response.headers), response.body)

    async def _receive(self, h: h11.Connection, reader: asyncio.StreamReader, timeout: float) -> None:
        data = await asyncio.wait_for(reader.read(READ_CHUNK), max(timeout, 0.0))
        h.receive_data(data)  # b"": the peer closed

    async def _read_request(
        self, h: h11.Connection, reader: asyncio.StreamReader, conn: _Conn, first: bool, head_deadline: float
    ) -> Request | None:
        """The next request, its body read and discarded; None when the client closed or idled out."""
        loop = asyncio.get_running_loop()
        limits = self._limits
        conn.set("new" if first else "idle", conn.since if first else loop.time())
        if not first and not h.trailing_data[0]:
            # kept alive: the next request may take the idle timeout to start
            try:
                await self._receive(h, reader, limits.idle_timeout)
            except asyncio.TimeoutError:
                return None
            head_deadline = loop.time() + limits.read_header_timeout
            if conn.state == "idle":
                conn.set("new", loop.time())
        received = bool(h.trailing_data[0]) or not first
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                try:
                    await self._receive(h, reader, head_deadline - loop.time())
                except asyncio.TimeoutError:
                    if not received and first:
                        return None  # a silent connection: nothing to answer
                    raise _Reject(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time") from None
                received = True
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                break
            raise _Reject(HTTPStatus.BAD_REQUEST, "unexpected data")
        if event.http_version not in (b"1.0", b"1.1"):
            raise _Reject(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)
        if _head_size(event) > limits.max_header_bytes:
            raise _Reject(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        method, target = event.method.decode("ascii"), origin_form(event.target)  # the absolute form too (RFC 9112 3.2.2)
        if target is None:
            raise _Reject(HTTPStatus.BAD_REQUEST, "malformed request target")
        headers = tuple((k.decode("ascii"), v.decode("latin-1")) for k, v in event.headers)
        names = {k for k, _ in headers}
        if "transfer-encoding" in names:
            raise _Reject(HTTPStatus.BAD_REQUEST, "request bodies with Transfer-Encoding are not accepted")
        length = int(dict(headers).get("content-length", "0"))  # h11 checked its syntax
        if length > limits.max_body_bytes:
            raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        expect = [v.strip().lower() for k, v in headers if k == "expect"]
        if expect and expect != ["100-continue"]:
            raise _Reject(HTTPStatus.EXPECTATION_FAILED)
        conn.set("busy", loop.time())
        body_deadline = loop.time() + limits.read_header_timeout
        if h.they_are_waiting_for_100_continue:
            await self._send(conn.writer, h.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        while True:  # the body (read and dropped: no route takes one)
            event = h.next_event()
            if event is h11.NEED_DATA:
                try:
                    await self._receive(h, reader, body_deadline - loop.time())
                except asyncio.TimeoutError:
                    raise _Reject(HTTPStatus.REQUEST_TIMEOUT, "request body not received in time") from None
                continue
            if isinstance(event, h11.EndOfMessage):
                break
            if isinstance(event, h11.ConnectionClosed):
                return None
        path, query = decode_path(target.decode("ascii"))
        route = self._router.route(path)
        return Request(
            method=method,
            path=path,
            query=query,
            headers=headers,
            route=route,
            deadline=self._deadline(headers) if route is Route.TELEMETRY else None,
        )

    # -- requests -----------------------------------------------------------------------

    async def _answer(self, request: Request) -> Response:
        await self._refresh_web(per_request=True)
        _, _, auth = self._web.current()
        if auth.enabled:
            denied = await self._authenticate(request)
            if denied is not None:
                return denied
        if request.route is not Route.TELEMETRY:
            return self._router(request)  # cheap: answered on the loop
        limit = self._limits.max_requests
        if limit and self._scrapes >= limit:
            return plain(503, "503 too many concurrent scrapes", (("Retry-After", "1"),))
        self._scrapes += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._render, request)
        except RuntimeError:  # the pool is shut down
            return plain(503, "503 shutting down")
        finally:
            self._scrapes -= 1

    def _render(self, request: Request) -> Response:
        try:
            return self._router(request)
        except Exception as exc:  # a bug, not the client's fault: one line, and the server goes on
            self._log.error(
                "request failed", exc_info=True, extra=fields(path=request.path, error=f"{exc.__class__.__name__}: {exc}")
            )
            return plain(500, "500 internal error")

    async def _authenticate(self, request: Request) -> Response | None:
        """None when the credentials are good; else the answer (401, 429 or 503)."""
        _, _, auth = self._web.current()
        unauthorized = plain(
            401, "401 Unauthorized", (("WWW-Authenticate", 'Basic realm="resmon-exporter", charset="UTF-8"'),)
        )
        creds = _basic_credentials(request.header("authorization"))
        if creds is None:
            return unauthorized
        known = auth.cached(*creds)
        if known is None:
            # the same credentials already being checked: wait for that answer, no slot taken
            flight = auth.in_flight(*creds)
            owner = flight is None
            if owner:
                if self._checks >= BCRYPT_QUEUE:
                    return plain(429, "429 too many password checks at once", (("Retry-After", "1"),))
                self._checks += 1
            try:
                if flight is None:
                    flight = auth.submit(self._bcrypt, *creds)
                # shielded: a client that leaves does not cancel the check others wait for
                known = await asyncio.shield(asyncio.wrap_future(flight))
            except (RuntimeError, asyncio.CancelledError):
                if not self._closing:
                    raise
                return plain(503, "503 shutting down")  # a queued check dropped at shutdown
            finally:
                if owner:
                    self._checks -= 1
        return None if known else unauthorized

    def _deadline(self, headers: tuple[tuple[str, str], ...]) -> float:
        """--collect.timeout, or Prometheus' scrape timeout minus the offset if that is
        shorter; never below MIN_DEADLINE."""
        timeout = self._limits.collect_timeout
        header = dict(headers).get("x-prometheus-scrape-timeout-seconds")
        if header:
            try:
                offered = float(header)
            except ValueError:
                offered = 0.0
            if 0 < offered < float("inf"):
                timeout = min(timeout, max(offered - self._limits.timeout_offset, MIN_DEADLINE))
        return timeout

