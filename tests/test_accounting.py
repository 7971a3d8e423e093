"""Busy time and energy per workload (exporter/accounting.py), in process: the split of each
interval's device energy over processes and workloads adds up to the device's increase, as a
property over random workloads, exits, lost GPUs and counter resets; and exact values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resmon_exporter.accounting import Accounting, workload_key
from resmon_exporter.samples import GpuIdentity, GpuProcess, GpuReading, GpuSample, ProcessSample

UUIDS = ("GPU-a", "GPU-b")


def _process(gpu: int, pid: int, container: str, job: str = "") -> ProcessSample:
    return ProcessSample(
        gpu=gpu, uuid=UUIDS[gpu], pid=pid, process=f"p{pid}", user="u", container_id=container, pod_uid="",
        namespace="", pod="", container="", memory_bytes=1, utilization=(), job_id=job,
    )


def _reading(devices: list[GpuSample]) -> GpuReading:
    return GpuReading(backend="nvml", success=True, device_count=len(devices), devices=tuple(devices))


def _gpu(gpu: int, energy: float | None, procs: list[GpuProcess], up: bool = True) -> GpuSample:
    ident = GpuIdentity(gpu, UUIDS[gpu])
    if not up:
        return GpuSample(ident, up=False)
    return GpuSample(ident, up=True, energy_joules=energy, process_list=tuple(procs))


def test_one_process_busy_half_the_interval_is_charged_half_the_energy() -> None:
    acc = Accounting()
    p = _process(0, 10, "c1")
    first = acc.update(_reading([_gpu(0, 1000.0, [GpuProcess(10, 1, (), (("sm", 0.0), ("memory", 0.0)))])]), (p,), "process", 100.0)
    assert first.processes[0].energy_joules == 0.0 and first.unattributed[0].joules == 0.0
    # 10 s later: 5 s of SM, 2 s of memory busy (the busiest engine, SM, is the share); 3000 J used
    later = acc.update(_reading([_gpu(0, 4000.0, [GpuProcess(10, 1, (), (("sm", 5.0), ("memory", 2.0)))])]), (p,), "process", 110.0)
    (proc,) = later.processes
    assert dict(proc.busy_seconds) == {"sm": 5.0, "memory": 2.0}
    assert proc.energy_joules == pytest.approx(1500.0)
    assert later.unattributed[0].joules == pytest.approx(1500.0)
    (work,) = later.workloads
    assert work.key == workload_key(p, "process") and work.energy_joules == pytest.approx(1500.0)


def test_time_sliced_processes_over_the_interval_are_scaled_to_the_device_increase() -> None:
    acc = Accounting()
    procs = (_process(0, 1, "a"), _process(0, 2, "b"))
    acc.update(_reading([_gpu(0, 0.0, [GpuProcess(1, 1), GpuProcess(2, 1)])]), procs, "container", 0.0)
    acc.update(_reading([_gpu(0, 0.0, [GpuProcess(1, 1, (), (("sm", 0.0),)), GpuProcess(2, 1, (), (("sm", 0.0),))])]), procs, "container", 0.0)
    # 10 s: samples say 9 s and 6 s (overlapping samples of time-sliced contexts): 15 s of 10
    out = acc.update(
        _reading([_gpu(0, 600.0, [GpuProcess(1, 1, (), (("sm", 9.0),)), GpuProcess(2, 1, (), (("sm", 6.0),))])]),
        procs, "container", 10.0,
    )
    energy = {w.key[0]: w.energy_joules for w in out.workloads}
    assert energy == {"a": pytest.approx(360.0), "b": pytest.approx(240.0)}
    assert out.unattributed[0].joules == pytest.approx(0.0)


def test_container_counter_keeps_what_an_exited_process_added() -> None:
    acc = Accounting()
    a, b = _process(0, 1, "c"), _process(0, 2, "c")
    acc.update(_reading([_gpu(0, 0.0, [GpuProcess(1, 1, (), (("sm", 0.0),)), GpuProcess(2, 1, (), (("sm", 0.0),))])]), (a, b), "container", 0.0)
    out = acc.update(
        _reading([_gpu(0, 100.0, [GpuProcess(1, 1, (), (("sm", 4.0),)), GpuProcess(2, 1, (), (("sm", 6.0),))])]),
        (a, b), "container", 10.0,
    )
    assert dict(out.workloads[0].busy_seconds) == {"sm": 10.0}
    out = acc.update(_reading([_gpu(0, 200.0, [GpuProcess(2, 1, (), (("sm", 6.0),))])]), (b,), "container", 20.0)
    (work,) = out.workloads
    assert dict(work.busy_seconds) == {"sm": 10.0} and work.energy_joules == pytest.approx(100.0)


def test_a_gpu_without_per_process_busy_time_serves_no_process_energy() -> None:
    acc = Accounting()
    p = _process(0, 1, "c")
    for at, energy in ((0.0, 0.0), (10.0, 50.0)):  # MIG: the process is listed without utilization
        out = acc.update(_reading([_gpu(0, energy, [GpuProcess(1, 1)])]), (p,), "process", at)
    assert out.workloads == () and out.processes == ()
    assert out.unattributed[0].joules == pytest.approx(50.0)


# -- the property ---------------------------------------------------------------------------


@dataclass
class _Step:
    dt: float
    energy: list[float]  # per GPU: the energy increase (negative: the counter restarted lower)
    up: list[bool]
    busy: list[dict[int, tuple[float, float]]]  # per GPU: pid -> (sm, memory) growth; absent: exited
    seen: list[set[int]]  # pids procfs has an answer for


_pid = st.integers(1, 12)
_growth = st.tuples(st.floats(0, 30, allow_nan=False), st.floats(0, 30, allow_nan=False))
_steps = st.lists(
    st.builds(
        _Step,
        dt=st.floats(0, 20, allow_nan=False),
        energy=st.lists(st.floats(-500, 5000, allow_nan=False), min_size=2, max_size=2),
        up=st.lists(st.sampled_from([True, True, True, False]), min_size=2, max_size=2),
        busy=st.lists(st.dictionaries(_pid, _growth, max_size=6), min_size=2, max_size=2),
        seen=st.lists(st.sets(_pid), min_size=2, max_size=2),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_steps, group_by=st.sampled_from(["process", "container"]), containers=st.integers(1, 4))
def test_parts_add_up_to_the_device_increase(steps: list[_Step], group_by: str, containers: int) -> None:
    acc = Accounting()
    at = 0.0
    energy = [1000.0, 1000.0]
    counters: list[dict[int, dict[str, float]]] = [{}, {}]  # the backend's per-pid counters
    served: dict[tuple[int, tuple[str, ...]], float] = {}  # workload -> its energy when last served
    busy_served: dict[tuple[int, tuple[str, ...], str], float] = {}
    unattributed: dict[int, float] = {}
    device_at: dict[int, float] = {}  # the device's counter at its last reading with the GPU up
    for step in steps:
        at += step.dt
        devices, procs = [], []
        for g in (0, 1):
            energy[g] = energy[g] + step.energy[g] if energy[g] + step.energy[g] >= 0 else 0.0
            live = {}
            for pid, (sm, mem) in step.busy[g].items():
                old = counters[g].get(pid, {"sm": 0.0, "memory": 0.0})
                live[pid] = {"sm": old["sm"] + sm, "memory": old["memory"] + mem}
            if step.up[g]:
                counters[g] = live  # exited pids' counters go with them, as in the backends
                devices.append(_gpu(g, energy[g], [GpuProcess(pid, 1, (), tuple(c.items())) for pid, c in live.items()]))
                procs += [_process(g, pid, f"c{pid % containers}") for pid in live if pid in step.seen[g]]
            else:
                devices.append(_gpu(g, None, [], up=False))
        out = acc.update(_reading(devices), tuple(procs), group_by, at)
        for g in (0, 1):
            if not step.up[g]:
                continue
            parts = 0.0
            mine = [w for w in out.workloads if w.gpu == g]
            if group_by == "process":  # a per-process series ends with the process: a pid back later is a new one
                keys = {w.key for w in mine}
                for table in (served, busy_served):
                    for k in [k for k in table if k[0] == g and k[1] not in keys]:
                        del table[k]
            for w in mine:
                assert w.energy_joules is not None
                before = served.get((g, w.key), 0.0)
                assert w.energy_joules >= before - 1e-9  # never decreases while served
                parts += w.energy_joules - before
                served[(g, w.key)] = w.energy_joules
                for engine, seconds in w.busy_seconds:
                    assert seconds >= busy_served.get((g, w.key, engine), 0.0) - 1e-9
                    busy_served[(g, w.key, engine)] = seconds
            (rest,) = [u.joules for u in out.unattributed if u.gpu == g]
            assert rest >= unattributed.get(g, 0.0) - 1e-6
            parts += rest - unattributed.get(g, 0.0)
            unattributed[g] = rest
            previous = device_at.get(g)
            increase = 0.0 if previous is None or energy[g] < previous else energy[g] - previous
            device_at[g] = energy[g]
            assert parts == pytest.approx(increase, rel=1e-9, abs=1e-6)
            for p in out.processes:
                if p.gpu == g:
                    assert p.energy_joules is not None and p.energy_joules >= 0.0
