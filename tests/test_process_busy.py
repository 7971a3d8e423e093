"""Per-process busy seconds from NVML's process utilization samples
(exporter/backends/nvml/process_busy.py), in process: exact values for known sample patterns."""

from __future__ import annotations

import pytest

from resmon_exporter.backends.nvml.process_busy import ProcessBusy

S = 1_000_000  # µs


def sm(out: dict[int, tuple[tuple[str, float], ...]], pid: int) -> float:
    return dict(out[pid])["sm"]


def test_each_sample_adds_its_period_and_an_idle_gap_is_not_filled() -> None:
    busy = ProcessBusy()
    # pid 1: 50 % sm every second for 4 s; pid 2 listed, no samples: 0
    out = busy.add("g", [(t * S, 1, (50, 20, 0, 0)) for t in range(1, 5)], [1, 2])
    assert sm(out, 1) == pytest.approx(2.0) and dict(out[1])["memory"] == pytest.approx(0.8)
    assert dict(out[2]) == {"sm": 0.0, "memory": 0.0, "encoder": 0.0, "decoder": 0.0}
    # the next sample on time: one period; after 20 s without samples (idle): one period, not 20 s
    out = busy.add("g", [(5 * S, 1, (100, 0, 0, 0)), (25 * S, 1, (100, 0, 0, 0))], [1, 2])
    assert sm(out, 1) == pytest.approx(4.0)


def test_a_process_no_longer_listed_ends_and_values_are_clamped() -> None:
    busy = ProcessBusy()
    busy.add("g", [(1 * S, 7, (40, 0, 0, 0)), (2 * S, 7, (40, 0, 0, 0))], [7])
    out = busy.add("g", [(3 * S, 7, (130, 0, 0, 0))], [])  # exited: its sample is dropped
    assert out == {}
    out = busy.add("g", [(4 * S, 7, (130, -5, 0, 0)), (5 * S, 7, (130, 0, 0, 0))], [7])  # a new process, pid reused
    assert sm(out, 7) == pytest.approx(2.0) and dict(out[7])["memory"] == 0.0


def test_after_a_restart_the_counters_go_on() -> None:
    busy = ProcessBusy()
    busy.add("g", [(1 * S, 3, (100, 0, 0, 0)), (2 * S, 3, (100, 0, 0, 0))], [3])
    busy.restart()  # the driver's clock started over: stamps below the last seen are new
    out = busy.add("g", [(S // 2, 3, (100, 0, 0, 0)), (S + S // 2, 3, (100, 0, 0, 0))], [3])
    assert sm(out, 3) == pytest.approx(4.0)
