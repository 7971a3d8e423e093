"""Pure-Python unit tests of the pieces with logic of their own."""

from __future__ import annotations

import collections
import logging
import time

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from resmon_exporter import host as host_module
from resmon_exporter.backends.nvml import errors as nvml_errors
from resmon_exporter.cli import parse_config, parse_duration, UsageError
from resmon_exporter.collectors.registry import ResourceCollector
from resmon_exporter.logs import JsonFormatter, LogfmtFormatter, fields
from resmon_exporter.samples import CollectorStatus, GpuIdentity, GpuReading, GpuSample, HostSample, Snapshot
from resmon_exporter.http.routes import parse_listen_address
from fakenvml import Scrape


@pytest.mark.parametrize(
    "text, seconds",
    [("1s", 1.0), ("500ms", 0.5), ("2m", 120.0), ("1m30s", 90.0), ("1.5s", 1.5), ("0", 0.0), ("2.5", 2.5), ("1h", 3600.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "1x", "s", "-1s", "1s2", "nan", "inf", "1 s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "text, expected",
    [(":9636", ("", 9636)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9636", ("::1", 9636)), ("localhost:80", ("localhost", 80))],
)
def test_parse_listen_address(text, expected):
    assert parse_listen_address(text) == expected


@pytest.mark.parametrize("text", ["9636", "::1:9636", "host:", "host:http", ":70000"])
def test_parse_listen_address_rejects(text):
    with pytest.raises(ValueError):
        parse_listen_address(text)


def test_flags_override_env_which_override_defaults():
    config, warnings = parse_config(["--collect.timeout=2s"], {"RESMON_COLLECT_TIMEOUT": "9s", "RESMON_COLLECT_CACHE_TTL": "250ms", "RESMON_X": "1"})
    assert config.collect_timeout == 2.0
    assert config.collect_cache_ttl == 0.25
    assert config.web_listen_address == ":9636"
    assert warnings == ["ignoring unknown environment variable RESMON_X"]
    with pytest.raises(UsageError):
        parse_config([], {"RESMON_GPU_BACKEND": "cuda"})


Times = collections.namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_cpu_utilization_is_a_delta_without_steal_or_iowait(monkeypatch):
    readings = iter(
        [
            Times(100, 0, 50, 800, 10, 0, 0, 40, 5, 0),
            # +30 user, +10 system, +40 idle, +10 iowait, +10 steal: busy 40 of 100
            Times(130, 0, 60, 840, 20, 0, 0, 50, 9, 0),
            Times(130, 0, 60, 840, 20, 0, 0, 50, 9, 0),  # no tick since: keep the last ratio
        ]
    )
    monkeypatch.setattr(host_module.psutil, "cpu_times", lambda: next(readings))
    reader = host_module.HostReader()
    first = reader.read()
    assert first.cpu_utilization_ratio == pytest.approx(0.40)
    assert dict(first.cpu_seconds)["user"] == 130  # guest is inside user already; not added
    assert reader.read().cpu_utilization_ratio == pytest.approx(0.40)


@pytest.mark.parametrize(
    "exc, outcome",
    [
        (pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), None),
        (pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), None),
        (pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), nvml_errors.DeviceDown),
        (pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), nvml_errors.DeviceDown),
        (pynvml.NVMLError(pynvml.NVML_ERROR_RESET_REQUIRED), nvml_errors.DeviceDown),
        (pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED), nvml_errors.BackendDown),
        (pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), nvml_errors.BackendDown),
        (pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND), nvml_errors.Missing),
        (pynvml.NVMLLibraryMismatchError("old driver"), nvml_errors.Missing),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), nvml_errors.DeviceDown),
    ],
)
def test_nvml_error_classification(exc, outcome):
    def fail():
        raise exc

    if outcome is None:
        assert nvml_errors.call(fail) is None
    else:
        with pytest.raises(outcome):
            nvml_errors.call(fail)


class _CountingMonitor:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.calls = 0

    def snapshot(self, timeout: float | None = None) -> Snapshot:
        self.calls += 1
        return self.snap


def _snapshot() -> Snapshot:
    ident = GpuIdentity(index=0, uuid="GPU-x", name="Test GPU", pci_bus_id="00000000:01:00.0",
                        clock_max_hertz=(("sm", 2e9),))
    up = GpuSample(ident, up=True, memory_total_bytes=100, memory_used_bytes=40, memory_free_bytes=60,
                   fan_speed_ratio=None, throttle_reasons=0x8, clock_hertz=(("sm", 1e9),))
    down = GpuSample(GpuIdentity(index=1), up=False)
    host = HostSample(0.25, (("user", 1.0),), 2, 0.1, 0.2, 0.3, 1000, 600, 0, 0)
    status = CollectorStatus(True, 0.001, 1.7e9)
    return Snapshot(GpuReading("nvml", True, 2, "550.1", (up, down)), status, host, status, time.monotonic())


def test_collector_in_an_applications_registry():
    monitor = _CountingMonitor(_snapshot())
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ResourceCollector(monitor))
    assert monitor.calls == 0  # registering touches no GPU
    s = Scrape(generate_latest(registry).decode())
    assert monitor.calls == 1
    assert s.value("resmon_gpu_memory_used_bytes", gpu="0", uuid="GPU-x") == 40
    assert s.series("resmon_gpu_up") == [({"gpu": "0", "uuid": "GPU-x"}, 1.0), ({"gpu": "1", "uuid": ""}, 0.0)]
    assert not s.has("resmon_gpu_fan_speed_ratio")
    assert not s.has("resmon_gpu_memory_used_bytes", gpu="1")
    assert s.value("resmon_gpu_throttle_active", gpu="0", uuid="GPU-x", reason="hw_slowdown") == 1
    assert s.value("resmon_gpu_clock_max_hertz", gpu="0", uuid="GPU-x", clock="sm") == 2e9
    assert s.value("resmon_memory_used_bytes") == 400
    # a second registry with the same collector names is rejected by prometheus_client
    with pytest.raises(ValueError):
        registry.register(ResourceCollector(monitor))


def _record(msg: str, **kv) -> logging.LogRecord:
    record = logging.LogRecord("resmon", logging.WARNING, __file__, 1, msg, (), None)
    record.__dict__.update(fields(**kv))
    return record


def test_logfmt_quotes_what_needs_quoting():
    line = LogfmtFormatter().format(_record("GPU not answering", gpu=1, error='GPU is "lost"', empty=""))
    assert " level=warn " in line
    assert 'msg="GPU not answering" gpu=1 error="GPU is \\"lost\\"" empty=""' in line


def test_json_log_lines():
    import json

    data = json.loads(JsonFormatter().format(_record("x", gpu=1, error=ValueError("bad"))))
    assert data["level"] == "warn" and data["gpu"] == 1 and data["error"] == "bad" and data["ts"].endswith("Z")
