"""HTTP routes: the landing page, the telemetry path, /-/healthy and /-/ready; 404/405 else.

The server (server.py) decodes the request once into a Request, including the route it
decided, and the Router turns it into a Response. A scrape reads one snapshot
(monitor.snapshot with the scrape's deadline) and renders exactly that snapshot, plus the
client library's process, platform and gc families, written by the direct renderer (render.py:
the bytes prometheus_client's encoders would write, at a fraction of the cost).
"""

from __future__ import annotations

import enum
import gzip
import html
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator
from urllib.parse import parse_qs, unquote

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..collectors.registry import ResourceCollector
from ..config import COLLECTOR_NAMES, FamilyFilter
from ..monitor import ResourceMonitor
from ..samples import Snapshot
from ..version import __version__
from .render import Renderer

ALLOWED = "GET, HEAD"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
# as prometheus_client labels what its encoder writes (names escaped with underscores)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
# the formats served, by media type: the versions accepted (None: no version parameter)
_FORMATS: dict[str, tuple[tuple[str | None, ...], str]] = {
    "application/openmetrics-text": ((None, "1.0.0"), OPENMETRICS),
    "text/plain": ((None, "0.0.4"), TEXT),
}
DEFAULT_COLLECTORS: tuple[Collector, ...] = (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR)


class Route(enum.Enum):
    TELEMETRY = "telemetry"
    LANDING = "landing"
    HEALTHY = "healthy"
    READY = "ready"
    NOT_FOUND = "not_found"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoded, once
    query: str
    headers: tuple[tuple[str, str], ...]  # names lower-case
    route: Route  # decided from path, once: used for the scrape limit and for dispatch
    deadline: float | None = None  # seconds the refresh may take (None: --collect.timeout)

    def header(self, name: str) -> str | None:
        """The header's values joined by ', ' (RFC 9110), or None."""
        values = [v for k, v in self.headers if k == name]
        return ", ".join(values) if values else None


@dataclass(frozen=True)
class Response:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def plain(status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, (("Content-Type", "text/plain; charset=utf-8"),) + extra, (text + "\n").encode())


_ABSOLUTE_SCHEMES = (b"http://", b"https://")
# RFC 3986 authority without userinfo (RFC 9110 4.2.4: a sender must not send it): an IP
# literal or a reg-name, then an optional port
_AUTHORITY = re.compile(rb"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]+)(:[0-9]*)?")


def origin_form(target: bytes) -> bytes | None:
    """The origin form (path and query) of a request target in origin or absolute form;
    None when it is neither. RFC 9112 3.2.2: a server MUST accept the absolute form (a
    client configured for a proxy sends it), and its authority wins over Host, which no
    route reads. An empty path is "/"."""
    if any(c < 0x21 or c > 0x7E for c in target):
        return None
    if target.startswith(b"/"):
        return target
    lowered = target[:8].lower()
    scheme = next((s for s in _ABSOLUTE_SCHEMES if lowered.startswith(s)), None)
    if scheme is None:
        return None
    rest = target[len(scheme):]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if not _AUTHORITY.fullmatch(authority) or b"#" in tail:  # a fragment is never sent
        return None
    return tail if tail.startswith(b"/") else b"/" + tail


def decode_path(target: str) -> tuple[str, str]:
    """(percent-decoded path, raw query) of a request target."""
    path, _, query = target.partition("?")
    return unquote(path, encoding="latin-1"), query


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


def _params(part: str) -> tuple[str, dict[str, str]]:
    """'type/sub; a=b; q=0.5' -> ('type/sub', {'a': 'b', 'q': '0.5'})."""
    media, *rest = part.split(";")
    params = {}
    for item in rest:
        name, _, value = item.partition("=")
        params[name.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), params


def _quality(params: dict[str, str]) -> float:
    try:
        q = float(params.get("q", "1"))
    except ValueError:
        return 0.0
    return q if 0.0 <= q <= 1.0 else 0.0


def negotiate(accept: str | None) -> str:
    """TEXT or OPENMETRICS: the client's most preferred format among those served (q-values
    weighed, q=0 refused, unknown versions skipped); TEXT when nothing matches. Always one
    of two constants, so neither Content-Type nor the render cache key carries client text.
    Written here because prometheus_client's choose_encoder copies the version and raises
    on malformed ones."""
    best, best_q = TEXT, 0.0
    for part in (accept or "").split(","):
        media, params = _params(part)
        if media not in _FORMATS:
            continue
        versions, content_type = _FORMATS[media]
        q = _quality(params)
        if params.get("version") in versions and q > best_q:
            best, best_q = content_type, q
    return best


def gzip_accepted(header: str | None) -> bool:
    """Accept-Encoding allows gzip: listed (or '*') with q > 0."""
    explicit: float | None = None
    wildcard: float | None = None
    for part in (header or "").split(","):
        coding, params = _params(part)
        if coding == "gzip":
            explicit = _quality(params)
        elif coding == "*":
            wildcard = _quality(params)
    q = explicit if explicit is not None else wildcard
    return q is not None and q > 0


class RenderCache:
    """Rendered expositions of the current snapshot: one per format (text or OpenMetrics,
    gzip or not) for the plain scrape, and the SELECTIONS most recently used collect[]
    selections (of any format). A scrape inside the cache window then costs a lookup instead
    of a render; a new snapshot drops them all. The client library's process_* and python_*
    values are therefore as old as the snapshot (at most --collect.cache-ttl).

    Bounded because a client may ask for every collect[] combination (2 x 2 x 511): one
    body each grew RSS by 16-36 MiB within a cache window, and freed memory stays with the
    process. A job with a collect[] of its own asks for the same selection every scrape and
    stays among the recent ones."""

    SELECTIONS = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._plain: dict[tuple[str, bool, frozenset[str] | None], bytes] = {}  # at most 4
        self._selected: OrderedDict[tuple[str, bool, frozenset[str] | None], bytes] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._plain) + len(self._selected)

    def get(self, snap: Snapshot, key: tuple[str, bool, frozenset[str] | None], render: Callable[[], bytes]) -> bytes:
        with self._lock:
            if self._snap is snap:
                body = self._plain.get(key) if key[2] is None else self._selected.get(key)
                if body is not None:
                    if key[2] is not None:
                        self._selected.move_to_end(key)
                    return body
        body = render()
        with self._lock:
            if self._snap is not snap:
                self._snap, self._plain, self._selected = snap, {}, OrderedDict()
            if key[2] is None:
                self._plain[key] = body
            else:
                self._selected[key] = body
                self._selected.move_to_end(key)
                while len(self._selected) > self.SELECTIONS:
                    self._selected.popitem(last=False)
        return body


@dataclass(frozen=True)
class PinnedExposition:
    """What the encoders render for one scrape: the default collectors and one snapshot's
    families; with names, only the samples of those names (as prometheus_client's
    restricted registry does it)."""

    defaults: tuple[Collector, ...]
    families: tuple[Metric, ...]
    names: frozenset[str] | None = None
    # --metrics.include/exclude over the defaults' families: FamilyFilter.keeps_family(name, type)
    keeps: Callable[[str, str], bool] | None = None

    def _all(self) -> Iterator[Metric]:
        for collector in self.defaults:
            for metric in collector.collect():
                if self.keeps is None or self.keeps(metric.name, metric.type):
                    yield metric
        yield from self.families

    def collect(self) -> Iterable[Metric]:
        for metric in self._all():
            if self.names is None:
                yield metric
                continue
            samples = [s for s in metric.samples if s.name in self.names]
            if samples:
                restricted = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                restricted.samples = samples
                yield restricted


class Router:
    """The exporter's routes: Router(request) -> Response. route() classifies a decoded path."""

    def __init__(
        self,
        monitor: ResourceMonitor,
        telemetry_path: str,
        defaults: tuple[Collector, ...] = DEFAULT_COLLECTORS,
    ) -> None:
        self._monitor = monitor
        self._resources = ResourceCollector(monitor)
        self._defaults = defaults
        self._cache = RenderCache()
        self._renderer = Renderer()  # its label strings are reused from scrape to scrape
        self._telemetry_path = telemetry_path
        self._landing = landing_page(telemetry_path)
        options = getattr(monitor, "options", None)
        metrics: FamilyFilter | None = getattr(options, "metrics", None)
        self._keeps = metrics.keeps_family if metrics is not None and metrics.active else None
        enabled = getattr(options, "collectors", None)
        self._enabled = frozenset(COLLECTOR_NAMES if enabled is None else enabled)
        self._routes = {
            telemetry_path: Route.TELEMETRY,
            "/": Route.LANDING,
            "/-/healthy": Route.HEALTHY,
            "/-/ready": Route.READY,
        }

    def route(self, path: str) -> Route:
        return self._routes.get(path, Route.NOT_FOUND)

    def __call__(self, request: Request) -> Response:
        """The full response, HEAD included (the server sends HEAD's headers without the body)."""
        if request.route is Route.NOT_FOUND:
            return plain(404, "404 page not found")
        if request.method not in ("GET", "HEAD"):
            return plain(405, f"405 method {request.method} not allowed; use GET or HEAD", (("Allow", ALLOWED),))
        if request.route is Route.TELEMETRY:
            return self._metrics(request)
        if request.route is Route.LANDING:
            return Response(200, (("Content-Type", "text/html; charset=utf-8"),), self._landing)
        if request.route is Route.HEALTHY:
            return plain(200, "resmon-exporter is healthy.")
        if self._monitor.ready:
            return plain(200, "resmon-exporter is ready.")
        return plain(503, "resmon-exporter is not ready: first refresh pending.")

    def _collectors(self, asked: list[str] | None) -> frozenset[str] | str | None:
        """collect[]=NAME (node_exporter's): the collectors asked for, None for all, or the
        400 answer's text for a name that is unknown or turned off by its flag."""
        if not asked:
            return None
        for name in asked:
            if name not in COLLECTOR_NAMES:
                return f"400 unknown collector {name!r} in collect[] (collectors: {', '.join(COLLECTOR_NAMES)})"
            if name not in self._enabled:
                return f"400 collector {name!r} in collect[] is disabled (--collector.{name} turns it on)"
        return frozenset(asked)

    def _metrics(self, request: Request) -> Response:
        content_type = negotiate(request.header("accept"))
        encoder = self._renderer.openmetrics if content_type == OPENMETRICS else self._renderer.text
        compress = gzip_accepted(request.header("accept-encoding"))
        query = parse_qs(request.query)
        names = query.get("name[]")
        collectors = self._collectors(query.get("collect[]"))
        if isinstance(collectors, str):
            return plain(400, collectors)
        # a scrape of the host alone reads no GPU (two jobs at two intervals cost what each asks)
        gpu = collectors is None or bool(collectors - {"host"})
        snap = self._monitor.snapshot(request.deadline) if gpu else self._monitor.host_snapshot()

        def render(only: frozenset[str] | None = None) -> bytes:
            families = tuple(self._resources.families(snap, collectors))
            exposition = PinnedExposition(self._defaults, families, only, self._keeps)
            out = encoder(exposition.collect())
            return gzip.compress(out) if compress else out

        if names:
            body = render(frozenset(names))
        else:
            body = self._cache.get(snap, (content_type, compress, collectors), render)
        headers: tuple[tuple[str, str], ...] = (("Content-Type", content_type), ("Vary", "Accept, Accept-Encoding"))
        if compress:
            headers += (("Content-Encoding", "gzip"),)
        return Response(200, headers, body)


def parse_listen_address(value: str) -> tuple[str, int]:
    """Go-style host:port; ':9636' means every interface, '[::1]:9636' an IPv6 host."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"invalid listen address {value!r}: want host:port, e.g. :9636 or 127.0.0.1:9636")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {value!r}: put an IPv6 host in brackets, e.g. [::1]:9636")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid listen address {value!r}: port must be a number from 0 to 65535")
    return host, int(port_text)
