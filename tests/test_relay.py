"""How a refresh starts its per-GPU reads (exporter/backends/nvml_workers.py): one GPU
after another while the driver answers at once, all together once its calls block, and a
GPU hung in its first call holding up no other. Read from the fake's call trace of the
real exporter; the order of calls, not their timing, is asserted."""

from __future__ import annotations

from fakenvml import gpu_keys
from scenarios import three_gpus

GPUS = 8
XID_CALLS = {"nvmlEventSetWait_v2", "nvmlDeviceRegisterEvents", "nvmlEventSetCreate", "nvmlEventSetFree"}


def eight_gpus(**extra: object) -> dict[str, object]:
    values: dict[str, object] = {"count": GPUS}
    for i in range(GPUS):
        values.update(gpu_keys(i, util_gpu=10 + i, power_mw=100000 + i))
    values.update(extra)
    return values


def refresh_traces(exporter, trace, n: int) -> list[list[int]]:
    """The GPU index of every device call in each of n scrapes (one refresh each)."""
    out = []
    for _ in range(n):
        trace.clear()
        scrape = exporter.scrape()
        assert scrape.value("resmon_collector_success", collector="gpu") == 1
        out.append([index for symbol, index in trace.lines() if index >= 0 and symbol not in XID_CALLS])
    return out


def one_after_another(indices: list[int]) -> bool:
    return indices == sorted(indices) and set(indices) == set(range(GPUS))


def test_a_driver_that_answers_at_once_is_read_one_gpu_after_another(run_exporter, scenario, trace):
    scenario.write(eight_gpus())
    exporter = run_exporter("--collect.cache-ttl=0", "--no-collector.xid")
    exporter.wait_ready()
    refresh_traces(exporter, trace, 10)  # start-up: its first calls may look blocked (a relay probe)
    traces = refresh_traces(exporter, trace, 12)
    in_order = sum(one_after_another(t) for t in traces)
    # all at once, 8 workers interleave their calls on every refresh; a relay keeps each
    # GPU's calls together (one refresh in a while may be started at once after a preempted probe)
    assert in_order >= 4, [t[:40] for t in traces]


def test_a_driver_that_blocks_has_every_gpu_in_flight_together(run_exporter, scenario, trace):
    # 300 us per call: GPU 0's read lasts at least 5 ms. A relay that waited for each read to
    # return, or for its RELAY_SECONDS (1 ms) each, would start GPU 7 after GPU 0 finished.
    scenario.write(eight_gpus(**{"delay_us.all": 300}))
    exporter = run_exporter("--collect.cache-ttl=0", "--no-collector.xid")
    exporter.wait_ready()
    for calls in refresh_traces(exporter, trace, 10):
        assert calls.index(GPUS - 1) < len(calls) - 1 - calls[::-1].index(0), calls


def test_a_gpu_hung_in_its_first_call_holds_up_no_other(run_exporter, scenario):
    values = three_gpus()
    scenario.write(values)
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    exporter.wait_ready()
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUUID": 9000})  # the relay's first read
    for _ in range(3):
        s = exporter.scrape()
        ups = {labels["gpu"]: v for labels, v in s.series("resmon_gpu_up")}
        assert ups == {"0": 0.0, "1": 1.0, "2": 1.0}, ups
        assert s.has("resmon_gpu_memory_used_bytes", gpu="2")
