"""--collect.slow-interval (issue 24): each slow value is served from its last slow read until
the interval has passed, then read again; an XID event of the GPU, or the GPU answering again
after being down, makes it read on the next refresh. In process, against the fake NVML."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

import scenarios as sc
from resmon_exporter.backends import GpuOptions
from resmon_exporter.backends.nvml.backend import NvmlBackend
from resmon_exporter.samples import GpuSample
from fakenvml import Scenario, load_in_process

INTERVAL = 2.0  # seconds: long enough that the refresh right after a change falls inside it on a busy machine


@pytest.fixture
def hopper(fake_libs, tmp_path_factory, tmp_path, monkeypatch) -> Scenario:
    load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    scenario = Scenario(tmp_path / "scenario.txt", {"count": 1, **sc.hopper_board(0), "gpu.0.fan": 40})
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    return scenario


def device(backend: NvmlBackend) -> GpuSample:
    (sample,) = backend.read().devices
    assert sample.up
    return sample


def ecc_count(s: GpuSample, error_type: str, scope: str) -> int:
    assert s.health is not None
    return dict(((t, sc_), n) for t, sc_, n in s.health.ecc_errors)[(error_type, scope)]


def ecc(s: GpuSample) -> int:
    return ecc_count(s, "corrected", "aggregate")


def remapped(s: GpuSample) -> int:
    assert s.health is not None
    return dict(s.health.remapped_rows)["correctable"]


def link_errors(s: GpuSample) -> int:
    return dict(s.nvlinks[3].errors)["replay"]


def link_active(s: GpuSample) -> int | None:
    return s.nvlinks[4].active


def pcie_gen(s: GpuSample) -> int:
    return dict(s.pcie_link_generation)["current"]


def fan(s: GpuSample) -> float | None:
    return s.fan_speed_ratio


def ecc_volatile(s: GpuSample) -> int:
    return ecc_count(s, "uncorrected", "volatile")


def ecc_pending(s: GpuSample) -> int:
    assert s.health is not None
    return dict(s.health.ecc_enabled)["pending"]


def retired(s: GpuSample) -> int | None:
    assert s.health is not None
    return dict(s.health.retired_pages).get("double_bit")


def pcie_gen_max(s: GpuSample) -> int:
    return dict(s.pcie_link_generation)["max"]


# slow value: (what to read, scenario change, the value after it)
SLOW: dict[str, tuple[Callable[[GpuSample], Any], dict[str, Any], Any]] = {
    "ecc_aggregate": (ecc, {"gpu.0.ecc.corrected.aggregate": 1234}, 1234),
    "remapped_rows": (remapped, {"gpu.0.remapped.correctable": 77}, 77),
    "nvlink_errors": (link_errors, {"gpu.0.nvlink.3.errors.replay": 999}, 999),
    "nvlink_state": (link_active, {"gpu.0.nvlink.4.active": 0}, 0),
    "pcie_link": (pcie_gen, {"gpu.0.pcie_gen": 1}, 1),
    "fan": (fan, {"gpu.0.fan": 90}, 0.9),
    "ecc_volatile": (ecc_volatile, {"gpu.0.ecc.uncorrected.volatile": 4321}, 4321),
    "ecc_mode": (ecc_pending, {"gpu.0.ecc_pending": 0}, 0),
    "retired_pages": (retired, {"gpu.0.page_retirement": 1, "gpu.0.retired.double_bit": 5}, 5),
    "pcie_link_max": (pcie_gen_max, {"gpu.0.pcie_gen_max": 2}, 2),
}


def wait_for(backend: NvmlBackend, read: Callable[[GpuSample], Any], want: Any, timeout: float = 10.0) -> float:
    """Refresh until read(sample) == want; the seconds it took."""
    start = time.monotonic()
    while read(device(backend)) != want:
        assert time.monotonic() - start < timeout, f"still {read(device(backend))!r}, want {want!r}"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.mark.parametrize("name", sorted(SLOW))
def test_a_slow_value_is_read_again_after_the_interval(hopper, log, name):
    read, change, after = SLOW[name]
    backend = NvmlBackend(log[0], explicit=True, options=GpuOptions(xid=False, slow_interval=INTERVAL))
    try:
        before = read(device(backend))
        assert before != after
        changed_at = time.monotonic()
        hopper.update(**change)
        assert read(device(backend)) == before  # the last slow read's value, inside the interval
        took = wait_for(backend, read, after)
        # read again once its interval (from its own last read, before the change) had passed
        assert time.monotonic() - changed_at <= INTERVAL + 2.0, took
        stamps = [p.read_at for p in backend.read().parts if p.name == "health"]
        assert stamps and stamps[0] is not None and time.time() - stamps[0] < INTERVAL + 2.0
    finally:
        backend.close()


@pytest.mark.parametrize("name", sorted(SLOW))
def test_a_slow_value_is_read_again_right_after_an_xid(hopper, log, name):
    read, change, after = SLOW[name]
    # an interval no test waits out: only the XID can make the value fresh
    backend = NvmlBackend(log[0], explicit=True, options=GpuOptions(xid=True, slow_interval=3600.0))
    try:
        before = read(device(backend))
        hopper.update(**change)
        assert read(device(backend)) == before
        # an event reaches only a registered watcher (no replay): one more each 0.5 s until seen
        events: list[str] = []
        start = time.monotonic()
        while read(device(backend)) != after:
            assert time.monotonic() - start < 10.0, f"still {read(device(backend))!r}, want {after!r}"
            if len(events) <= (time.monotonic() - start) / 0.5:
                events.append(f"{sc.board_uuid('hopper', 0)}:94")
                hopper.update(xid_events=",".join(events))
            time.sleep(0.02)
    finally:
        backend.close()


def test_a_gpu_back_from_down_reads_its_slow_part_at_once(hopper, log):
    backend = NvmlBackend(log[0], explicit=True, options=GpuOptions(xid=False, slow_interval=3600.0))
    try:
        assert ecc(device(backend)) != 4321
        hopper.update(**{"gpu.0.rc.all": sc.UNKNOWN})
        (down,) = backend.read().devices
        assert not down.up
        hopper.update(**{"gpu.0.rc.all": None, "gpu.0.ecc.corrected.aggregate": 4321})
        wait_for(backend, ecc, 4321, timeout=5.0)
    finally:
        backend.close()


def test_interval_zero_reads_every_value_on_every_refresh(hopper, log):
    backend = NvmlBackend(log[0], explicit=True, options=GpuOptions(xid=False, slow_interval=0.0))
    try:
        device(backend)
        hopper.update(**{"gpu.0.ecc.corrected.aggregate": 55, "gpu.0.pcie_gen": 2})
        s = device(backend)
        assert ecc(s) == 55 and pcie_gen(s) == 2
    finally:
        backend.close()
