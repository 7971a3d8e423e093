"""The exporter's HTTP side, wired together: router, server, signals.

SIGTERM/SIGINT: graceful stop within SHUTDOWN_GRACE (under docker stop's 10 s; requests
still running then: exit 1 at once); a second one exits at once (128 + the signal number).
SIGHUP re-reads the web config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from .. import logs
from ..config import Config
from ..monitor import ResourceMonitor
from ..version import __version__
from .routes import Router, parse_listen_address
from .server import HttpServer, Limits
from .web_config import WebConfigSource

# in-flight requests may finish within this; the process is gone before docker stop's 10 s
# SIGKILL (past the grace it exits at once, status 1)
SHUTDOWN_GRACE = 8.0


def format_address(addr: tuple[Any, ...]) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}"


def serve(config: Config, monitor: ResourceMonitor, web: WebConfigSource, log: logging.Logger) -> int:
    """Serve until SIGTERM/SIGINT; the exit code. The monitor is started and closed by the caller."""
    limits = Limits(
        max_requests=config.web_max_requests,
        read_header_timeout=config.web_read_header_timeout,
        idle_timeout=config.web_idle_timeout,
        timeout_offset=config.web_timeout_offset,
        collect_timeout=config.collect_timeout,
    )
    server = HttpServer(Router(monitor, config.web_telemetry_path), web, limits, log)
    host, port = parse_listen_address(config.web_listen_address)

    async def main() -> int:
        try:
            bound = await server.start(host, port)
        except OSError as exc:
            log.error(f"cannot listen on {config.web_listen_address}: {exc.strerror or exc}")
            return 1
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()

        def stop(sig: signal.Signals) -> None:
            if stopped.is_set():  # the second signal: no more waiting
                log.warning("second signal, exiting now", extra=logs.fields(signal=sig.name))
                sys.stderr.flush()
                os._exit(128 + sig.value)
            stopped.set()

        def reload() -> None:
            task = loop.create_task(server.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig)
        loop.add_signal_handler(signal.SIGHUP, reload)
        # signals are handled before anyone is told we listen
        log.info(
            "listening",
            extra=logs.fields(
                # every bound address (':port' binds IPv4 and IPv6); the first stays right after address=
                address=",".join(format_address(a) for a in bound),
                telemetry_path=config.web_telemetry_path,
                tls=web.tls_enabled,
                version=__version__,
                gpu_backend=config.gpu_backend,
            ),
        )
        await stopped.wait()
        log.info("shutting down")
        if not await server.shutdown(grace=SHUTDOWN_GRACE):
            # a request stuck past the grace (a hung driver call) would hold the exit
            # (Python joins pool threads at exit): leave now, before docker stop's SIGKILL
            log.error("exiting with requests still running", extra=logs.fields(grace_s=SHUTDOWN_GRACE))
            for handler in log.handlers:
                handler.flush()
            os._exit(1)
        return 0

    return asyncio.run(main())
