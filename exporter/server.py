"""A bounded HTTP/1.1 server for the exporter (asyncio front, small thread pool behind).

prometheus_client's server starts an unbounded thread per request and sets no timeouts.
Here connections live on one event loop, so idle or slow clients cost a socket, not a
thread: a request's head must arrive within the read-header timeout, an idle keep-alive
connection is closed after the idle timeout, heads and bodies are size-limited
(431/413), and at most max_requests scrapes of the telemetry path run at once (503
beyond; as node_exporter, health checks and the landing page do not count). Requests run
the WSGI app on a bounded thread pool. TLS and basic auth come from the web config,
re-read when it changes. SIGTERM/SIGINT: stop accepting, let in-flight requests finish,
close idle connections, return.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, Iterable
from urllib.parse import unquote

from .collector import SCRAPE_TIMEOUT
from .logs import fields
from .web_config import Authenticator, WebConfigSource

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")
MAX_CONNECTIONS = 512


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


class _Reject(Exception):
    """Answer with this status and close the connection."""

    def __init__(self, status: HTTPStatus, detail: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail or status.phrase


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]


def _response(status: int, reason: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    names = set()
    for name, value in headers:
        names.add(name.lower())
        lines.append(f"{name}: {value}")
    if "content-length" not in names:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _plain(status: HTTPStatus, text: str) -> tuple[int, str, list[tuple[str, str]], bytes]:
    return status.value, status.phrase, [("Content-Type", "text/plain; charset=utf-8")], (text + "\n").encode()


def parse_head(head: bytes) -> _Request:
    """Request line and headers; _Reject(400) for anything malformed."""
    try:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise _Reject(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, version = parts
        if not _TOKEN.match(method):
            raise _Reject(HTTPStatus.BAD_REQUEST, "malformed method")
        if not _VERSION.match(version):
            raise _Reject(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED if version.startswith(b"HTTP/") else HTTPStatus.BAD_REQUEST)
        if not target.startswith(b"/") or any(c < 0x21 or c == 0x7F for c in target):
            raise _Reject(HTTPStatus.BAD_REQUEST, "malformed request target")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise _Reject(HTTPStatus.BAD_REQUEST, "malformed header line")
            key = name.decode("ascii").lower()
            text = value.strip(b" \t").decode("latin-1")
            if any(c in text for c in "\r\n\0"):
                raise _Reject(HTTPStatus.BAD_REQUEST, "malformed header value")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        return _Request(method.decode("ascii"), target.decode("ascii"), version.decode("ascii"), headers)
    except UnicodeDecodeError:
        raise _Reject(HTTPStatus.BAD_REQUEST, "malformed request") from None


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header[:6].lower() == "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if sep else None


def call_wsgi(app: WsgiApp, environ: dict[str, Any]) -> tuple[int, str, list[tuple[str, str]], bytes]:
    captured: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        captured[:] = [status, headers]

    body = b"".join(app(environ, start_response))
    code, _, reason = captured[0].partition(" ")
    return int(code), reason, list(captured[1]), body


class HttpServer:
    def __init__(
        self, app: WsgiApp, web: WebConfigSource, limits: Limits, log: logging.Logger, limited_path: str = "/metrics"
    ) -> None:
        self._app = app
        self._limited_path = limited_path
        self._web = web
        self._limits = limits
        self._log = log
        # scrapes plus a few threads for the cheap routes; more requests wait in the pool's queue
        self._pool = ThreadPoolExecutor(max_workers=(limits.max_requests or 64) + 4, thread_name_prefix="resmon-http")
        self._active = 0  # requests in the pool
        self._scrapes = 0  # of which on the telemetry path
        self._connections = 0
        self._idle: set[asyncio.StreamWriter] = set()
        self._closing = False
        self._server: asyncio.base_events.Server | None = None
        self._drained: asyncio.Event | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """Bind (OSError when the address is taken) and return the bound addresses."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._drained = asyncio.Event()
        self._server = await asyncio.start_server(
            self._handle, host or None, port, limit=self._limits.max_header_bytes, reuse_address=True, backlog=256
        )
        return [s.getsockname() for s in self._server.sockets]

    async def shutdown(self, grace: float) -> None:
        """Stop accepting; wait up to grace seconds for in-flight requests; close the rest."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._idle):
            writer.close()
        if self._active and self._drained is not None:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), grace)
            except asyncio.TimeoutError:
                self._log.warning("requests still running at shutdown", extra=fields(requests=self._active))
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # TLS handshake failures, resets and the like: one debug line, never a traceback
        self._log.debug("connection error", extra=fields(error=str(context.get("exception") or context.get("message"))))

    # -- connections --------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= self._limits.max_connections or self._closing:
            writer.close()
            return
        self._connections += 1
        try:
            _, ctx, _ = self._web.current()
            if ctx is not None and not await self._start_tls(reader, writer, ctx):
                return
            first = True
            while not self._closing:
                self._idle.add(writer)
                try:
                    request, body = await self._read_request(reader, first)
                finally:
                    self._idle.discard(writer)
                if request is None:
                    return
                first = False
                keep = request.version == "HTTP/1.1" and "close" not in request.headers.get("connection", "").lower()
                keep = keep or "keep-alive" in request.headers.get("connection", "").lower()
                status, reason, headers, payload = await self._dispatch(request, writer)
                keep = keep and not self._closing
                writer.write(_response(status, reason, headers, payload, keep))
                await asyncio.wait_for(writer.drain(), self._limits.write_timeout)
                if not keep:
                    return
        except _Reject as rej:
            status, reason, headers, payload = _plain(rej.status, f"{rej.status.value} {rej.detail}")
            try:
                writer.write(_response(status, reason, headers, payload, False))
                await asyncio.wait_for(writer.drain(), self._limits.write_timeout)
            except (OSError, asyncio.TimeoutError):
                pass
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            self._connections -= 1
            writer.close()

    async def _start_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: ssl.SSLContext) -> bool:
        # Per connection, with the context as it is now: a rotated certificate applies at once.
        try:
            if sys.version_info >= (3, 11):
                await writer.start_tls(ctx, ssl_handshake_timeout=self._limits.read_header_timeout)
            else:  # pragma: no cover - Python 3.10
                loop = asyncio.get_running_loop()
                protocol = writer.transport.get_protocol()
                transport = await loop.start_tls(
                    writer.transport, protocol, ctx, server_side=True,
                    ssl_handshake_timeout=self._limits.read_header_timeout,
                )
                writer._transport = transport  # type: ignore[attr-defined]
                protocol._stream_writer = writer  # type: ignore[attr-defined]
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            self._log.debug("TLS handshake failed", extra=fields(error=str(exc)))
            return False
        return True

    async def _read_request(self, reader: asyncio.StreamReader, first: bool) -> tuple[_Request | None, bytes]:
        limits = self._limits
        # a new connection must start its request promptly; a kept-alive one may idle longer
        try:
            start = await asyncio.wait_for(reader.readexactly(1), limits.read_header_timeout if first else limits.idle_timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            return None, b""
        try:
            rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.read_header_timeout)
        except asyncio.LimitOverrunError:
            raise _Reject(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
        except asyncio.IncompleteReadError as exc:
            if len(exc.partial) + 1 >= limits.max_header_bytes:
                raise _Reject(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
            return None, b""
        except asyncio.TimeoutError:
            raise _Reject(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time") from None
        except ValueError:  # readuntil's limit, older Pythons
            raise _Reject(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
        request = parse_head((start + rest)[:-4])
        if "transfer-encoding" in request.headers:
            raise _Reject(HTTPStatus.BAD_REQUEST, "request bodies with Transfer-Encoding are not accepted")
        length_text = request.headers.get("content-length", "0")
        if not length_text.isdigit():
            raise _Reject(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
        length = int(length_text)
        if length > limits.max_body_bytes:
            raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        body = b""
        if length:
            try:
                body = await asyncio.wait_for(reader.readexactly(length), limits.read_header_timeout)
            except asyncio.TimeoutError:
                raise _Reject(HTTPStatus.REQUEST_TIMEOUT, "request body not received in time") from None
        return request, body

    # -- requests -----------------------------------------------------------------------

    async def _dispatch(self, request: _Request, writer: asyncio.StreamWriter) -> tuple[int, str, list[tuple[str, str]], bytes]:
        config, _, auth = self._web.current()
        scrape = request.target.partition("?")[0] == self._limited_path
        if scrape and self._limits.max_requests and self._scrapes >= self._limits.max_requests:
            status, reason, headers, body = _plain(HTTPStatus.SERVICE_UNAVAILABLE, "503 too many concurrent scrapes")
            return status, reason, headers + [("Retry-After", "1")] + list(config.headers), body
        self._active += 1
        self._scrapes += scrape
        try:
            loop = asyncio.get_running_loop()
            peer = writer.get_extra_info("peername") or ("", 0)
            status, reason, headers, body = await loop.run_in_executor(
                self._pool, self._run_app, request, auth, peer, self._web.tls_enabled
            )
        finally:
            self._active -= 1
            self._scrapes -= scrape
            if self._active == 0 and self._drained is not None:
                self._drained.set()
        return status, reason, headers + list(config.headers), body

    def _scrape_timeout(self, request: _Request) -> float:
        """--collect.timeout, or Prometheus' scrape timeout minus the offset if that is shorter."""
        timeout = self._limits.collect_timeout
        header = request.headers.get("x-prometheus-scrape-timeout-seconds")
        if header:
            try:
                offered = float(header)
            except ValueError:
                offered = 0.0
            if offered > 0 and offered == offered:
                timeout = min(timeout, max(offered - self._limits.timeout_offset, 0.05))
        return timeout

    def _run_app(self, request: _Request, auth: Authenticator, peer: tuple[Any, ...], tls: bool) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if auth.enabled:
            creds = _basic_credentials(request.headers.get("authorization"))
            if creds is None or not auth.check(*creds):
                status, reason, headers, body = _plain(HTTPStatus.UNAUTHORIZED, "401 Unauthorized")
                return status, reason, headers + [("WWW-Authenticate", 'Basic realm="resmon-exporter", charset="UTF-8"')], body
        path, _, query = request.target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method,
            "PATH_INFO": unquote(path, encoding="latin-1"),
            "QUERY_STRING": query,
            "SERVER_PROTOCOL": request.version,
            "REMOTE_ADDR": str(peer[0]),
            "wsgi.url_scheme": "https" if tls else "http",
        }
        for name, value in request.headers.items():
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
                key = "HTTP_" + key
            environ[key] = value
        token = SCRAPE_TIMEOUT.set(self._scrape_timeout(request))
        try:
            return call_wsgi(self._app, environ)
        except Exception as exc:  # a bug, not the client's fault: one line, and the server goes on
            self._log.error("request failed", extra=fields(path=path, error=f"{exc.__class__.__name__}: {exc}"))
            return _plain(HTTPStatus.INTERNAL_SERVER_ERROR, "500 internal error")
        finally:
            SCRAPE_TIMEOUT.reset(token)
