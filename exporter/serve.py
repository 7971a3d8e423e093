"""The exporter's HTTP side, wired together: registry, router, server, signals."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from prometheus_client.registry import CollectorRegistry

from . import logs
from .collector import ResourceCollector
from .monitor import ResourceMonitor
from .server import HttpServer, Limits
from .version import __version__
from .web import Router, parse_listen_address
from .web_config import WebConfigSource

if TYPE_CHECKING:
    from .cli import Config


def serve(config: "Config", monitor: ResourceMonitor, web: WebConfigSource, log: logging.Logger) -> int:
    """Serve until SIGTERM/SIGINT; the exit code. The monitor is started and closed by the caller."""
    registry = CollectorRegistry()
    for default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(default)
    registry.register(ResourceCollector(monitor))
    limits = Limits(
        max_requests=config.web_max_requests,
        read_header_timeout=config.web_read_header_timeout,
        idle_timeout=config.web_idle_timeout,
        timeout_offset=config.web_timeout_offset,
        collect_timeout=config.collect_timeout,
    )
    server = HttpServer(Router(registry, monitor, config.web_telemetry_path), web, limits, log, config.web_telemetry_path)
    host, port = parse_listen_address(config.web_listen_address)

    async def main() -> int:
        try:
            bound = await server.start(host, port)
        except OSError as exc:
            log.error(f"cannot listen on {config.web_listen_address}: {exc.strerror or exc}")
            return 1
        addr = bound[0]
        log.info(
            "listening",
            extra=logs.fields(
                address=f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}",
                telemetry_path=config.web_telemetry_path,
                tls=web.tls_enabled,
                version=__version__,
                gpu_backend=config.gpu_backend,
            ),
        )
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()
        log.info("shutting down")
        await server.shutdown(grace=config.collect_timeout + 5.0)
        return 0

    return asyncio.run(main())
