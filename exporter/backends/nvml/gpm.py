"""The profiling collector's NVML reads: GPM (GPU Performance Monitoring), Hopper and newer.

GPM values are computed by the driver between two samples (shared/reference/nvml-extended.md
section 6). A scrape never sleeps for a second sample: each refresh takes one sample and
computes against the newest kept sample at least MIN_WINDOW older, so the first refresh
emits nothing and a fast scrape still gets a window of MIN_WINDOW or more. Per source (a
GPU, or a MIG GPU instance) at most three sample buffers are allocated, each once, and
reused: the two kept ones and the one being taken. Every buffer is freed before nvmlShutdown (free_all).

A symbol the driver lacks turns off only what needs it (nvmlGpmMigSampleGet came with R525,
GPM with R520), until the next init. The sample and metrics calls are not memoised: a
NO_DATA or NOT_FOUND answer is no value this refresh, never a minute without one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml

from ...samples import PROFILING_BANDWIDTHS, PROFILING_RATIOS, ProfilingSample
from . import errors as nvml_errors
from .errors import DeviceDown, Missing

MIN_WINDOW = 1.0  # seconds: the shortest window a value is computed over (a faster scrape reuses the older sample)
MAX_WINDOW = 600.0  # seconds: a kept sample older than this is dropped (a GPU away this long starts afresh)
_BUFFERS = 3  # two kept samples and the one being taken
_MIB = 1048576  # GPM bandwidths are MiB/s
_METRIC_IDS: tuple[int, ...] = (*(mid for _, mid in PROFILING_RATIOS), *(mid for _, _, mid in PROFILING_BANDWIDTHS))

Ask = Callable[..., Any]  # HealthReader.ask bound to a device key
_CORE = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmMetricsGet")
_SAMPLE_GET, _MIG_SAMPLE_GET = "nvmlGpmSampleGet", "nvmlGpmMigSampleGet"


@dataclass
class _Source:
    """The sample buffers of one GPU or GPU instance. kept: (monotonic time, buffer), oldest first."""

    spare: list[Any] = field(default_factory=list)
    kept: list[tuple[float, Any]] = field(default_factory=list)
    tag: Any = None  # what the samples were taken of (a MIG instance's identity): a change starts afresh
    allocated: int = 0


def convert(metrics: Any, count: int) -> ProfilingSample | None:
    """The families' values from a filled nvmlGpmMetricsGet_t: percent / 100 clamped to 0..1,
    MiB/s x 1048576; an entry with its own error or a NaN is left out."""
    values: dict[int, float] = {}
    for i in range(count):
        m = metrics.metrics[i]
        value = float(m.value)
        if nvml_errors.entry_ok(int(m.nvmlReturn)) and math.isfinite(value):
            values[int(m.metricId)] = value
    ratios = tuple((name, min(max(values[mid] / 100.0, 0.0), 1.0)) for name, mid in PROFILING_RATIOS if mid in values)
    bandwidths = tuple(
        (link, direction, values[mid] * _MIB) for link, direction, mid in PROFILING_BANDWIDTHS if mid in values and values[mid] >= 0
    )
    if not ratios and not bandwidths:
        return None
    return ProfilingSample(ratios=ratios, bandwidths=bandwidths)


class GpmReader:
    """GPM support, sample buffers and windows of every device (and MIG GPU instance)."""

    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        # symbols the binding lacks for good; the driver's are found per init (free_all resets)
        self._unbound = {n for n in (*_CORE, _SAMPLE_GET, _MIG_SAMPLE_GET) if not hasattr(pynvml, n)}
        self._missing: set[str] = set(self._unbound)
        self._supported: dict[str, bool] = {}  # device key -> the support query's answer, per init
        self._sources: dict[tuple[str, int | None], _Source] = {}  # (device key, GPU instance id or None)
        # GPUs are read on parallel workers, and a GPU going down drops its windows from the
        # reader's thread: the bookkeeping above is changed under this lock, never held
        # across an NVML call (a hung GPU must not block the others)
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Some device has GPM (the profiling collector reports its status)."""
        with self._lock:
            return any(self._supported.values())

    def _lacks(self, *names: str) -> bool:
        return any(n in self._missing for n in (*_CORE, *names))

    def supported(self, key: str, handle: Any, ask: Ask) -> bool:
        if self._lacks():
            return False
        with self._lock:
            known = self._supported.get(key)
        if known is not None:
            return known
        try:
            answer = ask(key, "gpm_support", nvml_errors.call, pynvml.nvmlGpmQueryDeviceSupport, handle, part="profiling")
        except Missing:  # a driver older than GPM: never asked again until the next init
            self._lose("nvmlGpmQueryDeviceSupport")
            return False
        if answer is None:  # NOT_SUPPORTED / NO_PERMISSION: asked again after HealthReader's recheck
            return False
        known = bool(int(answer.isSupportedDevice))
        with self._lock:
            self._supported[key] = known
        return known

    def _lose(self, symbol: str) -> None:
        with self._lock:
            self._missing.add(symbol)

    def read(
        self, key: str, handle: Any, ask: Ask, instance: int | None = None, tag: Any = None
    ) -> ProfilingSample | None:
        """One refresh of one GPU (instance None: nvmlGpmSampleGet) or GPU instance of it
        (nvmlGpmMigSampleGet on the parent handle). None until a window exists. tag: what
        the instance is now; a different tag (the instance was destroyed and another made
        under its id) drops the old samples, so two instances are never diffed."""
        symbol = _SAMPLE_GET if instance is None else _MIG_SAMPLE_GET
        if self._lacks(symbol):
            return None
        with self._lock:
            source = self._sources.get((key, instance))
            if source is not None and source.tag != tag:
                source.spare += [buf for _, buf in source.kept]
                source.kept = []
            if source is None:
                source = self._sources[(key, instance)] = _Source(tag=tag)
            source.tag = tag
            buf = source.spare.pop() if source.spare else None
        if buf is None:  # allocated on first need, at most _BUFFERS: a refused source holds one
            try:
                buf = ask(key, "gpm_alloc", nvml_errors.call, pynvml.nvmlGpmSampleAlloc, part="profiling")
            except Missing:
                self._lose("nvmlGpmSampleAlloc")
                return None
            if buf is None:  # failed (logged, the part fails): tried again next refresh
                return None
            with self._lock:
                source.allocated += 1
        suffix = "" if instance is None else f".{instance}"
        try:
            if instance is None:
                taken = ask(key, "gpm_sample", nvml_errors.call, pynvml.nvmlGpmSampleGet, handle, buf, part="profiling", remember=False)
            else:
                taken = ask(key, f"gpm_mig_sample{suffix}", nvml_errors.call, pynvml.nvmlGpmMigSampleGet, handle, instance, buf,
                            part="profiling", remember=False)
        except Missing:
            self._lose(symbol)
            taken = None
        except BaseException:  # a lost GPU or library: the buffer stays this source's, freed by free_all
            with self._lock:
                source.spare.append(buf)
            raise
        now = self._clock()
        with self._lock:
            if taken is None:  # not supported or failed this once: no window across the gap
                source.spare += [buf, *(b for _, b in source.kept)]
                source.kept = []
                return None
            for stale in [k for k in source.kept if now - k[0] > MAX_WINDOW]:
                source.kept.remove(stale)
                source.spare.append(stale[1])
            base = next((b for t, b in reversed(source.kept) if now - t >= MIN_WINDOW), None)
        try:
            out = self._compute(key + suffix, ask, base, buf) if base is not None else None
        finally:
            with self._lock:
                if not source.kept or now - source.kept[-1][0] >= MIN_WINDOW:
                    source.kept.append((now, buf))  # kept; the older of two kept ones is reused
                    if len(source.kept) > _BUFFERS - 1:
                        source.spare.append(source.kept.pop(0)[1])
                else:  # a fast scrape: the older samples stay the baseline, this buffer is reused
                    source.spare.append(buf)
        return out

    def _compute(self, key: str, ask: Ask, older: Any, newer: Any) -> ProfilingSample | None:
        request = pynvml.c_nvmlGpmMetricsGet_t()  # one per call: GPUs are read on parallel workers
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_METRIC_IDS)
        for i, mid in enumerate(_METRIC_IDS):
            request.metrics[i].metricId = mid
        request.sample1, request.sample2 = older, newer
        try:
            answer = ask(key, "gpm_metrics", nvml_errors.call, pynvml.nvmlGpmMetricsGet, request, part="profiling", remember=False)
        except Missing:
            self._lose("nvmlGpmMetricsGet")
            return None
        if answer is None:
            return None
        return convert(answer, len(_METRIC_IDS))

    def drop(self, key: str) -> None:
        """The device went down: no window across the gap (it may have been reset meanwhile);
        the buffers stay and are reused when it answers again."""
        with self._lock:
            for (k, _), source in self._sources.items():
                if k == key and source.kept:
                    source.spare += [b for _, b in source.kept]
                    source.kept = []

    def forget_instances(self, key: str, alive: set[int]) -> None:
        """GPU instances of this device that no longer exist: their buffers go back to NVML."""
        with self._lock:
            gone = [self._sources.pop(s) for s in list(self._sources) if s[0] == key and s[1] is not None and s[1] not in alive]
        for source in gone:
            self._free(source)

    def forget(self, key: str) -> None:
        """A device that left for good: its buffers go back to NVML, its support answer goes."""
        with self._lock:
            gone = [self._sources.pop(s) for s in list(self._sources) if s[0] == key]
            self._supported.pop(key, None)
        for source in gone:
            self._free(source)

    def free_all(self) -> None:
        """Before nvmlShutdown (and on re-init): every buffer back; support and the symbols
        are asked again (the next init may load another driver)."""
        with self._lock:
            sources = list(self._sources.values())
            self._sources.clear()
            self._supported.clear()
            self._missing = set(self._unbound)
        for source in sources:
            self._free(source)

    def _free(self, source: _Source) -> None:
        for buf in [*source.spare, *(b for _, b in source.kept)]:
            if buf is None:
                continue
            try:
                nvml_errors.call(pynvml.nvmlGpmSampleFree, buf)
            except (Missing, DeviceDown, nvml_errors.BackendDown):  # the library is going away anyway
                pass
        with self._lock:
            source.spare, source.kept = [], []
