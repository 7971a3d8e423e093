"""Serve resmon-exporter's metrics from your own Python application.

    python examples/serve_from_python.py --port 8000     # then: curl -s localhost:8000/metrics

--port 0 takes any free port; the first line printed says which (serving http://ADDRESS:PORT/metrics).

The application owns the HTTP server (prometheus_client's WSGI app on the standard library's
threading WSGI server: what start_http_server builds, made here so that the port bound can be
printed on every prometheus-client this project supports; start_http_server returns its server
only from 0.20 on) and the registry; resmon_exporter adds its collector to it. It serves until Ctrl-C (SIGINT) or
SIGTERM, then closes the monitor, which stops its GPU thread and shuts NVML down.
"""

from __future__ import annotations

import argparse
import signal
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from resmon_exporter import ResourceCollector, ResourceMonitor

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the program open


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per scrape on stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (the printed URL says which)")
    parser.add_argument("--address", default="127.0.0.1", help="127.0.0.1: this host only; 0.0.0.0: every interface")
    args = parser.parse_args()

    # Blocked before any thread starts, so every thread inherits the mask and the main
    # thread alone takes the signal, in sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    with ResourceMonitor() as monitor:
        registry = CollectorRegistry()
        registry.register(ResourceCollector(monitor))  # registering touches no GPU
        # served from a daemon thread, as start_http_server does: without the wait below the
        # script would end, and the server with it
        server = make_server(args.address, args.port, make_wsgi_app(registry), ThreadingServer, handler_class=QuietHandler)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        # the port bound, not the one asked for: with --port 0 the kernel picked it, and a
        # caller reads it here (a port found free first and bound later can be taken between)
        print(f"serving http://{args.address}:{server.server_port}/metrics (Ctrl-C stops)", flush=True)
        received = signal.sigwait(STOP_SIGNALS)
        print(f"stopping on {signal.Signals(received).name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
