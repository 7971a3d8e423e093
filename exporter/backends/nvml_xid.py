"""XID event watcher (stub: the interface the NVML backend is wired to; the body follows)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from exporter.samples import XidState


class XidWatcher:
    def __init__(self, log: logging.Logger, wait_ms: int = 500, min_backoff: float = 1.0, max_backoff: float = 30.0) -> None:
        self._log = log
        self._wait_ms = wait_ms
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff

    def watch(self, devices: Mapping[str, Any]) -> None:
        pass

    def state(self) -> XidState:
        return XidState()

    def stop(self, timeout: float) -> bool:
        return True
