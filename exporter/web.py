"""HTTP routes: the exporter's pages in front of prometheus_client's WSGI app.

prometheus_client's app answers every path with metrics; this router serves the landing
page, the telemetry path, /-/healthy and /-/ready, and 404/405 for everything else.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Iterable

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from .monitor import ResourceMonitor
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


class Router:
    """WSGI application with the exporter's routes."""

    def __init__(self, registry: CollectorRegistry, monitor: ResourceMonitor, telemetry_path: str) -> None:
        self._metrics = make_wsgi_app(registry)
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
            return self._metrics({**environ, "REQUEST_METHOD": "GET"}, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [self._landing]
        if path == "/-/healthy":
            return _plain(start_response, "200 OK", "resmon-exporter is healthy.\n")
        if self._monitor.ready:
            return _plain(start_response, "200 OK", "resmon-exporter is ready.\n")
        return _plain(start_response, "503 Service Unavailable", "resmon-exporter is not ready: first refresh pending.\n")


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
