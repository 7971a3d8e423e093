"""Serve resmon-exporter's metrics from your own Python application.

    python examples/serve_from_python.py --port 8000     # then: curl -s localhost:8000/metrics

--port 0 takes any free port; the first line printed says which (serving http://ADDRESS:PORT/metrics).

The application owns the HTTP server (prometheus_client's start_http_server) and the
registry; resmon_exporter adds its collector to it. It serves until Ctrl-C (SIGINT) or
SIGTERM, then closes the monitor, which stops its GPU thread and shuts NVML down.
"""

from __future__ import annotations

import argparse
import signal

from prometheus_client import CollectorRegistry, start_http_server

from resmon_exporter import ResourceCollector, ResourceMonitor

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


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
        # start_http_server serves from a daemon thread and returns at once: without the
        # wait below the script would end, and the server with it.
        server, _ = start_http_server(args.port, addr=args.address, registry=registry)
        # the port bound, not the one asked for: with --port 0 the kernel picked it, and a
        # caller reads it here (a port found free first and bound later can be taken between)
        print(f"serving http://{args.address}:{server.server_port}/metrics (Ctrl-C stops)", flush=True)
        received = signal.sigwait(STOP_SIGNALS)
        print(f"stopping on {signal.Signals(received).name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
