"""HTTP routes: the exporter's pages in front of prometheus_client's WSGI app.

prometheus_client's app answers every path with metrics; this router serves the landing
page, the telemetry path, /-/healthy and /-/ready, and 404/405 for everything else.
"""

from __future__ import annotations

import gzip
import html
import threading
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from .collector import PINNED_SNAPSHOT, SCRAPE_TIMEOUT
from .monitor import ResourceMonitor
from .samples import Snapshot
from .version import __version__

StartResponse = Callable[..., Any]
Environ = dict[str, Any]

_ALLOWED = "GET, HEAD"


def _plain(start_response: StartResponse, status: str, body: str, extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")] + (extra or []))
    return [body.encode()]


def landing_page(telemetry_path: str) -> bytes:
    path = html.escape(telemetry_path, quote=True)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>resmon-exporter</title></head>
<body>
<h1>resmon-exporter</h1>
<p>Prometheus exporter for GPU (NVML) and host resources. Version {html.escape(__version__)}.</p>
<ul>
<li><a href="{path}">Metrics</a> ({path})</li>
<li><a href="/-/healthy">Health</a></li>
<li><a href="/-/ready">Readiness</a></li>
</ul>
</body></html>
""".encode()


class RenderCache:
    """Rendered expositions of the current snapshot, one per format (text or OpenMetrics,
    gzip or not). A scrape inside the cache window then costs a lookup instead of a render;
    a new snapshot drops them all. The client library's process_* and python_* values are
    therefore as old as the snapshot (at most --collect.cache-ttl)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._bodies: dict[tuple[str, bool], bytes] = {}

    def get(self, snap: Snapshot, key: tuple[str, bool], render: Callable[[], bytes]) -> bytes:
        with self._lock:
            if self._snap is snap and key in self._bodies:
                return self._bodies[key]
        body = render()
        with self._lock:
            if self._snap is not snap:
                self._snap, self._bodies = snap, {}
            self._bodies[key] = body
        return body


def _gzip_accepted(header: str | None) -> bool:
    # as prometheus_client does it: q-values are not weighed
    return any(part.split(";")[0].strip().lower() == "gzip" for part in (header or "").split(","))


class Router:
    """WSGI application with the exporter's routes."""

    def __init__(self, registry: CollectorRegistry, monitor: ResourceMonitor, telemetry_path: str) -> None:
        self._registry = registry
        self._cache = RenderCache()
        self._monitor = monitor
        self._telemetry_path = telemetry_path
        self._landing = landing_page(telemetry_path)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        captured: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            captured[:] = [status, headers]

        method = environ.get("REQUEST_METHOD", "GET")
        body = b"".join(self._route(environ, method, capture))
        status, headers = captured
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = headers + [("Content-Length", str(len(body)))]
        start_response(status, headers)
        # HEAD: same headers (length included), no body
        return [] if method == "HEAD" else [body]

    def _route(self, environ: Environ, method: str, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path not in (self._telemetry_path, "/", "/-/healthy", "/-/ready"):
            return _plain(start_response, "404 Not Found", "404 page not found\n")
        if method not in ("GET", "HEAD"):
            return _plain(
                start_response,
                "405 Method Not Allowed",
                f"405 method {method} not allowed; use GET or HEAD\n",
                [("Allow", _ALLOWED)],
            )
        if path == self._telemetry_path:
            return self._metrics(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [self._landing]
        if path == "/-/healthy":
            return _plain(start_response, "200 OK", "resmon-exporter is healthy.\n")
        if self._monitor.ready:
            return _plain(start_response, "200 OK", "resmon-exporter is ready.\n")
        return _plain(start_response, "503 Service Unavailable", "resmon-exporter is not ready: first refresh pending.\n")

    def _metrics(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Content negotiation, gzip and ?name[]= as prometheus_client's own app does them."""
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        compress = _gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        snap = self._monitor.snapshot(SCRAPE_TIMEOUT.get())
        token = PINNED_SNAPSHOT.set(snap)
        try:
            if names:
                body = encoder(self._registry.restricted_registry(names))
                body = gzip.compress(body) if compress else body
            else:
                def render() -> bytes:
                    out = encoder(self._registry)
                    return gzip.compress(out) if compress else out

                body = self._cache.get(snap, (content_type, compress), render)
        finally:
            PINNED_SNAPSHOT.reset(token)
        headers = [("Content-Type", content_type)] + ([("Content-Encoding", "gzip")] if compress else [])
        start_response("200 OK", headers)
        return [body]



def parse_listen_address(value: str) -> tuple[str, int]:
    """Go-style host:port; ':9636' means every interface, '[::1]:9636' an IPv6 host."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"invalid listen address {value!r}: want host:port, e.g. :9636 or 127.0.0.1:9636")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {value!r}: put an IPv6 host in brackets, e.g. [::1]:9636")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid listen address {value!r}: port must be a number from 0 to 65535")
    return host, int(port_text)
