"""Counters that never decrease while the exporter runs, and the clock-event bits (issue 22
items 5 and 7). In-process: the real NvmlBackend and pynvml against the fake libnvidia-ml
loaded here, a ResourceMonitor around it, and the collector's families of every snapshot,
with the fake's scenario rewritten between refreshes."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scenarios as sc
from resmon_exporter import ResourceMonitor
from resmon_exporter.backends import GpuOptions
from resmon_exporter.backends.nvml.backend import NvmlBackend
from resmon_exporter.collectors.registry import snapshot_families
from resmon_exporter.counters import Monotonic
from fakenvml import Scenario, load_in_process

UNKNOWN = 999
BASE = sc.health_machine()
UUIDS = [BASE[f"gpu.{i}.uuid"] for i in range(3)]
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def nvml(fake_libs, tmp_path_factory, tmp_path, monkeypatch) -> Scenario:
    load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    scenario = Scenario(tmp_path / "scenario.txt", BASE)
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    return scenario


def make_monitor(log: logging.Logger, xid: bool = False) -> ResourceMonitor:
    # no backoff: a lost library is initialised again on the next refresh
    backend = NvmlBackend(log, explicit=True, min_backoff=0.0, max_backoff=0.0, device_timeout=5.0,
                          options=GpuOptions(health=True, nvlink=True, xid=xid, profiling=False, mig=False,
                                             slow_interval=0.0))  # every value on every refresh
    return ResourceMonitor(logger=log, backend=backend, cache_ttl=0, collect_timeout=5.0, collect_host=False)


def series(monitor: ResourceMonitor) -> Series:
    """Every sample of one refresh's families; a label set twice in a family fails."""
    out: Series = {}
    for family in snapshot_families(monitor.snapshot()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in out, f"two series {key}"
            out[key] = sample.value
    return out


def value(s: Series, name: str, **labels: str) -> float | None:
    found = [v for (n, lab), v in s.items() if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    assert len(found) <= 1, found
    return found[0] if found else None


# -- item 5: clock-event bits ---------------------------------------------------------------

def test_board_limit_and_reliability_bits_are_throttle_reasons(nvml, log):
    nvml.update(**{"gpu.0.clocks_event_reasons": 0x600, "gpu.1.clocks_event_reasons": 512})
    with make_monitor(log[0]) as m:
        s = series(m)
    for gpu, active in ((UUIDS[0], {"board_limit", "reliability"}), (UUIDS[1], {"board_limit"})):
        for reason in ("board_limit", "reliability", "gpu_idle", "sw_power_cap"):
            assert value(s, "resmon_gpu_throttle_active", uuid=gpu, reason=reason) == (1 if reason in active else 0), (gpu, reason)


# -- item 7: one source per clock-event reason, PCIe unwrapping, resets ----------------------

def test_a_failed_field_batch_does_not_switch_a_clock_event_source(nvml, log):
    # the driver has field 269 (3 s) and the older violation call (7 s): the field is the
    # source, also in the refresh whose field batch fails
    nvml.update(**{"gpu.0.violation.1": 7_000_000_000})
    with make_monitor(log[0]) as m:
        seen = [value(series(m), "resmon_gpu_clock_event_seconds_total", uuid=UUIDS[0], reason="sw_thermal_slowdown")]
        nvml.update(**{"gpu.0.rc.nvmlDeviceGetFieldValues": UNKNOWN})
        seen.append(value(series(m), "resmon_gpu_clock_event_seconds_total", uuid=UUIDS[0], reason="sw_thermal_slowdown"))
        nvml.update(**{"gpu.0.rc.nvmlDeviceGetFieldValues": None})
        seen.append(value(series(m), "resmon_gpu_clock_event_seconds_total", uuid=UUIDS[0], reason="sw_thermal_slowdown"))
    assert seen[0] == seen[2] == 3.0
    assert seen[1] in (None, 3.0), seen


def test_pcie_byte_counters_are_unwrapped_by_their_width(nvml, log):
    near = 2**32 - 300
    nvml.update(**{"gpu.0.field_type.197": 1, "gpu.0.field.197": near})  # a 32-bit counter
    with make_monitor(log[0]) as m:
        assert value(series(m), "resmon_gpu_pcie_bytes_total", uuid=UUIDS[0], direction="transmit") == near
        nvml.update(**{"gpu.0.field.197": 100})  # wrapped: 400 bytes later
        assert value(series(m), "resmon_gpu_pcie_bytes_total", uuid=UUIDS[0], direction="transmit") == 2**32 + 100
        nvml.update(**{"gpu.0.field.197": 5000})
        assert value(series(m), "resmon_gpu_pcie_bytes_total", uuid=UUIDS[0], direction="transmit") == 2**32 + 5000


def test_a_gpu_reset_does_not_make_a_counter_go_down(nvml, log):
    nvml.update(**{"gpu.0.energy_mj": 5_000_000})
    with make_monitor(log[0]) as m:
        assert value(series(m), "resmon_gpu_energy_joules_total", uuid=UUIDS[0]) == 5000.0
        nvml.update(**{"gpu.0.energy_mj": 1000, "gpu.0.ecc.corrected.volatile": 0})  # the reset restarted them
        s = series(m)
        assert value(s, "resmon_gpu_energy_joules_total", uuid=UUIDS[0]) == 5001.0
        assert value(s, "resmon_gpu_ecc_errors_total", uuid=UUIDS[0], type="corrected", scope="volatile") == 3
        nvml.update(**{"gpu.0.energy_mj": 3000, "gpu.0.ecc.corrected.volatile": 2})
        s = series(m)
        assert value(s, "resmon_gpu_energy_joules_total", uuid=UUIDS[0]) == 5003.0
        assert value(s, "resmon_gpu_ecc_errors_total", uuid=UUIDS[0], type="corrected", scope="volatile") == 5


def test_monotonic_is_safe_under_concurrent_callers():
    counters = Monotonic()
    keys = [("gpu", "family", (("n", str(i)),)) for i in range(8)]
    barrier = threading.Barrier(8)

    def feed(key: Any) -> None:
        barrier.wait()
        for step in range(2000):
            counters.value(key, step % 100)  # resets every 100 steps
    threads = [threading.Thread(target=feed, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 20 runs of 0..99: 19 resets each added 99
    assert all(counters.value(k, 99) == 19 * 99 + 99 for k in keys)


# -- the property: random fault sequences never make a _total series smaller ------------------

# counters of the scenario, by GPU (see tests/scenarios.py); a GPU reset sets them lower
COUNTER_KEY = re.compile(
    r"gpu\.\d\.(energy_mj|ecc\.\w+\.\w+|field\.(74|76|77|78|79|269|270|271|197|198)|violation\.\d"
    r"|pcie_replays|nvlink\.\d+\.(tx_kib|rx_kib|errors\.\w+))$"
)
FLIPPABLE = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieReplayCounter",
             "nvmlDeviceGetViolationStatus", "nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetSamples")
WRAP_32 = 2**32


class Machine:
    """The scenario as counter levels plus the faults in force."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.levels: dict[str, int] = {k: int(v) for k, v in BASE.items() if COUNTER_KEY.match(k)}
        for i in range(3):
            self.levels[f"gpu.{i}.energy_mj"] = 1_000_000
        self.levels["gpu.2.field.197"] = WRAP_32 - 10_000  # the consumer's TX counter is 32 bits wide
        self.levels["gpu.0.violation.1"] = 7_000_000_000  # the H100 has both thermal sources: never mixed
        self.faults: dict[str, Any] = {"gpu.2.field_type.197": 1}
        self.once: dict[str, Any] = {}  # for the next refresh only
        self.xids: list[str] = []

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, gpu = op[0], op[1]
        prefix = f"gpu.{gpu}."
        if kind == "advance":
            for key in self.levels:
                if key.startswith(prefix):
                    self.levels[key] += op[2]
        elif kind == "reset":  # counters restart lower
            for key in self.levels:
                if key.startswith(prefix):
                    self.levels[key] //= op[2]
        elif kind == "lost":
            self.toggle(f"{prefix}rc.all", sc.GPU_IS_LOST)
        elif kind == "batch":
            self.toggle(f"{prefix}rc.nvmlDeviceGetFieldValues", UNKNOWN)
        elif kind == "unsupported":
            self.toggle(f"{prefix}rc.{op[2]}", sc.NOT_SUPPORTED)
        elif kind == "entry":
            self.toggle(f"{prefix}field_rc.{op[2]}", sc.NOT_SUPPORTED)
        elif kind == "reinit":  # the library goes away for one refresh; nvmlInit may fail once too
            self.once["rc.nvmlDeviceGetCount_v2"] = sc.DRIVER_NOT_LOADED
        elif kind == "xid":
            self.xids.append(f"{UUIDS[gpu]}:{op[2]}")
        self.levels["gpu.2.field.197"] %= WRAP_32

    def toggle(self, key: str, rc: int) -> None:
        if self.faults.pop(key, None) is None:
            self.faults[key] = rc

    def write(self) -> None:
        values = {**BASE, **self.levels, **self.faults, **self.once}
        if self.xids:
            values["xid_events"] = ",".join(self.xids)
        self.scenario.write(values)
        self.once = {}


GPU = st.integers(0, 2)
OPS = st.one_of(
    st.tuples(st.just("advance"), GPU, st.integers(1, 10**9)),
    st.tuples(st.just("reset"), GPU, st.integers(2, 1000)),
    st.tuples(st.just("lost"), GPU),
    st.tuples(st.just("batch"), GPU),
    st.tuples(st.just("unsupported"), GPU, st.sampled_from(FLIPPABLE)),
    st.tuples(st.just("entry"), GPU, st.sampled_from((74, 269, 197, 198))),
    st.tuples(st.just("reinit"), GPU),
    st.tuples(st.just("xid"), st.just(0), st.sampled_from((48, 79, 94))),
)


def totals(s: Series) -> Iterator[tuple[tuple[str, tuple[tuple[str, str], ...]], float]]:
    return ((k, v) for k, v in s.items() if k[0].endswith("_total"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=10))
def test_no_counter_ever_decreases_under_random_faults(nvml, log, ops):
    machine = Machine(nvml)
    machine.write()
    highest: dict[Any, float] = {}
    seen_families: set[str] = set()
    with make_monitor(log[0], xid=True) as m:
        for step, op in enumerate([None, *ops]):
            if op is not None:
                machine.apply(op)
                machine.write()
            s = series(m)
            assert len([k for k in s if k[0] == "resmon_gpu_up"]) == 3, (step, op, [k for k in s if k[0] == "resmon_gpu_up"])
            for key, v in totals(s):
                seen_families.add(key[0])
                assert v >= highest.get(key, v), f"{key} went from {highest[key]} to {v} after {ops[:step]}"
                highest[key] = v
    assert {"resmon_gpu_energy_joules_total", "resmon_gpu_ecc_errors_total", "resmon_gpu_nvlink_bytes_total",
            "resmon_gpu_pcie_bytes_total", "resmon_gpu_clock_event_seconds_total"} <= seen_families
