"""How a refresh starts its per-GPU reads (exporter/backends/nvml/workers.py): one GPU
after another while the driver answers at once, all together once its calls block, and a
GPU hung in its first call holding up no other. Read from the fake's call trace of the
real exporter; the order of calls, not their timing, is asserted."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from resmon_exporter.backends.nvml import workers as nvml_workers
from resmon_exporter.backends.nvml.workers import DeviceWorker, Relay, Starts
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
    # 300 us per call: a probe finds the driver blocking after 4 calls and starts the rest at
    # once, so GPU 7 starts while GPU 0 is early in its read. Passed on only by the refresh's
    # 1 ms timer (no probe), GPU 7 would start after about 7 ms: GPU 0's 20th call or later.
    scenario.write(eight_gpus(**{"delay_us.all": 300}))
    exporter = run_exporter("--collect.cache-ttl=0", "--no-collector.xid")
    exporter.wait_ready()
    for calls in refresh_traces(exporter, trace, 10):
        gpu0 = [k for k, index in enumerate(calls) if index == 0]
        assert len(gpu0) > 12 and calls.index(GPUS - 1) < gpu0[12], calls


def test_a_gpu_hung_in_its_first_call_holds_up_no_other(run_exporter, scenario):
    values = three_gpus()
    scenario.write(values)
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    exporter.wait_ready()
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetMemoryInfo_v2": 9000})  # the first call of the relay's first read
    for _ in range(3):
        s = exporter.scrape()
        ups = {labels["gpu"]: v for labels, v in s.series("resmon_gpu_up")}
        assert ups == {"0": 0.0, "1": 1.0, "2": 1.0}, ups
        assert s.has("resmon_gpu_memory_used_bytes", gpu="2")


# -- the relay itself, with real worker threads and jobs that record their order --------------


@contextlib.contextmanager
def relay_jobs(n: int, hang_first: bool = False) -> Iterator[tuple[list[DeviceWorker], list, list[int], threading.Event]]:
    """n real workers, a job each that logs its index, and the gate: with hang_first, GPU 0's
    job waits for it (set at the end at the latest) like a GPU hung in a call."""
    gate = threading.Event()
    log: list[int] = []
    workers = [DeviceWorker(i) for i in range(n)]

    def job(i: int):
        def run() -> int:
            log.append(i)
            if hang_first and i == 0:
                gate.wait(10)
            return i

        return run

    try:
        yield workers, [(w, job(i)) for i, w in enumerate(workers)], log, gate
    finally:
        gate.set()
        for w in workers:
            w.stop()
        for w in workers:
            w.join(5)


def test_each_read_starts_the_next_when_it_returns(monkeypatch):
    # with the refresh's own timer out of the way (10 s), only the reads can pass the relay
    monkeypatch.setattr(nvml_workers, "RELAY_SECONDS", 10.0)
    with relay_jobs(8) as (workers, jobs, log, _):
        started = time.monotonic()
        submitted = Relay(jobs).run(time.monotonic() + 30)
        assert time.monotonic() - started < 5  # not 8 x 10 s: each read passed the relay on
        assert submitted == [True] * 8
        assert [w.wait(time.monotonic() + 5)[:2] for w in workers] == [(True, i) for i in range(8)]
        assert log == list(range(8))


def test_a_read_that_holds_the_relay_is_passed_and_a_busy_worker_skipped():
    with relay_jobs(4, hang_first=True) as (workers, jobs, _, _):
        busy = threading.Event()
        assert workers[2].submit(lambda: busy.wait(10))  # still busy from an earlier refresh
        try:
            submitted = Relay(jobs).run(time.monotonic() + 30)
            assert submitted == [True, True, False, True]
            assert workers[3].wait(time.monotonic() + 5)[:2] == (True, 3)  # GPU 0 still hung
            assert not workers[0].wait(time.monotonic())[0]
        finally:
            busy.set()


def test_no_read_starts_after_the_deadline():
    with relay_jobs(3, hang_first=True) as (workers, jobs, log, gate):
        submitted = Relay(jobs).run(time.monotonic())  # the refresh has no time left
        assert submitted == [True, False, False]
        gate.set()
        assert workers[0].wait(time.monotonic() + 5)[0]
        time.sleep(0.05)
        assert log == [0]  # GPU 0's late return started nothing


def test_a_driver_found_blocking_is_read_all_at_once_for_the_next_refreshes():
    starts = Starts()
    modes = []
    for k in range(10):
        relay = starts.relay([])
        modes.append("at once" if relay.at_once else "relay")
        relay.blocked = k == 1  # the probe of the second refresh found the driver blocking
        starts.learn(relay)
    expected_at_once = nvml_workers.PROBE_EVERY - 1
    assert modes[:2] == ["relay", "relay"]
    assert modes[2 : 2 + expected_at_once] == ["at once"] * expected_at_once
    assert modes[2 + expected_at_once :] == ["relay"] * (8 - expected_at_once)
