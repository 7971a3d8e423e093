"""How a refresh runs its per-GPU reads (exporter/backends/nvml/workers.py): one GPU
after another on one thread while the driver answers at once, all together once its calls
block, and a GPU hung in its first call holding up no other. Read from the fake's call trace of the
real exporter; the order of calls, not their timing, is asserted."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

from resmon_exporter.backends.nvml import workers as nvml_workers
from resmon_exporter.backends.nvml.workers import GpuSlot, Readers, Starts
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


# -- the chain itself, with real reader threads and jobs that record their order --------------


@contextlib.contextmanager
def chain_jobs(n: int, hang_first: bool = False) -> Iterator[tuple[Readers, list, list[tuple[int, str]], threading.Event]]:
    """Readers, n slots with a job each that logs (its index, its thread's name), and the
    gate: with hang_first, GPU 0's job waits for it (set at the end at the latest) like a GPU
    hung in a call."""
    gate = threading.Event()
    log: list[tuple[int, str]] = []
    readers = Readers()
    readers.ensure(n)  # as the backend does: one reader per GPU
    slots = [GpuSlot(i) for i in range(n)]

    def job(i: int):
        def run() -> int:
            log.append((i, threading.current_thread().name))
            if hang_first and i == 0:
                gate.wait(10)
            return i

        return run

    try:
        yield readers, [(s, job(i)) for i, s in enumerate(slots)], log, gate
    finally:
        gate.set()
        readers.stop()
        readers.join(5)


def test_a_chain_reads_the_gpus_in_order_on_one_thread(monkeypatch):
    # with the refresh's own timer out of the way (10 s), nothing but the chain moves the reads
    monkeypatch.setattr(nvml_workers, "RELAY_SECONDS", 10.0)
    with chain_jobs(8) as (readers, jobs, log, _):
        started = time.monotonic()
        chain = readers.run(jobs, time.monotonic() + 30)
        assert time.monotonic() - started < 5  # not 8 x 10 s: each read went on to the next
        assert readers.outcome(chain) == [(True, True, i, None) for i in range(8)]
        assert [i for i, _ in log] == list(range(8))
        assert len({name for _, name in log}) == 1  # no hand-off between threads
        assert readers.threads == 8
        chain = readers.run(jobs, time.monotonic() + 30)  # the next refresh: the same readers
        assert readers.outcome(chain)[7] == (True, True, 7, None)
        assert readers.threads == 8


def test_a_read_that_holds_the_chain_is_passed_and_a_busy_gpu_skipped():
    with chain_jobs(4, hang_first=True) as (readers, jobs, log, gate):
        busy = threading.Event()
        other = readers.run([(jobs[2][0], lambda: busy.wait(10))], time.monotonic() + 0.2)  # still busy from an earlier refresh
        assert readers.outcome(other) == [(True, False, None, None)]
        try:
            chain = readers.run(jobs, time.monotonic() + 3)
            outcome = readers.outcome(chain)
            assert [started for started, *_ in outcome] == [True, True, False, True]
            assert outcome[3] == (True, True, 3, None)  # GPU 0 still hung
            assert outcome[0][:2] == (True, False)
            assert jobs[0][0].busy and not jobs[1][0].busy
        finally:
            busy.set()
        assert readers.wait_idle(time.monotonic() + 0.5) is False  # GPU 0's read is still running
        readers.ensure(4)  # the next refresh: the hung read's reader beside four idle ones
        assert readers.threads == 5
        for _ in range(3):  # no thread made or ended per refresh while it hangs
            readers.run(jobs[1:], time.monotonic() + 3)
            readers.ensure(4)
        assert readers.threads == 5
        gate.set()  # the hung read returns
        assert readers.wait_idle(time.monotonic() + 5)
        deadline = time.monotonic() + 5
        while readers.threads != 4 and time.monotonic() < deadline:  # its reader ends: one per GPU again
            time.sleep(0.01)
        assert readers.threads == 4


def test_no_read_starts_after_the_deadline():
    with chain_jobs(3, hang_first=True) as (readers, jobs, log, gate):
        chain = readers.run(jobs, time.monotonic())  # the refresh has no time left
        assert readers.outcome(chain)[1:] == [(False, False, None, None)] * 2
        gate.set()
        assert readers.wait_idle(time.monotonic() + 5)
        time.sleep(0.05)
        assert [i for i, _ in log] == [0]  # the first read always starts; its late return started nothing


def test_a_read_that_returns_after_the_deadline_starts_no_other(monkeypatch):
    # the read holds the GIL past the deadline, so the refresh cannot close the chain before
    # the read returns: its reader must see the deadline itself
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 10.0)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        with chain_jobs(3) as (readers, jobs, log, _):
            def spin() -> int:
                log.append((0, threading.current_thread().name))
                end = time.monotonic() + 0.2
                while time.monotonic() < end:
                    pass
                return 0

            chain = readers.run([(jobs[0][0], spin), *jobs[1:]], time.monotonic() + 0.05)
            assert readers.wait_idle(time.monotonic() + 5)
            assert [i for i, _ in log] == [0]
            assert [started for started, *_ in readers.outcome(chain)] == [True, False, False]
    finally:
        sys.setswitchinterval(switch)


def test_the_refresh_waits_without_polling_once_every_read_started(monkeypatch):
    lends = []
    lend = Readers._lend
    monkeypatch.setattr(Readers, "_lend", lambda self, chain, n: (lends.append(n), lend(self, chain, n)))
    with chain_jobs(2, hang_first=True) as (readers, jobs, log, gate):
        threading.Timer(0.3, gate.set).start()
        chain = readers.run(jobs[:1], time.monotonic() + 5)  # one GPU, hung for 0.3 s
        assert readers.outcome(chain) == [(True, True, 0, None)]
        assert lends == [1]  # not one try per millisecond while the hung read holds the only job


def inside_a_call(done: threading.Event) -> None:
    """Wait for done as a read waits inside an NVML call (errors._timed marks the slot)."""
    slot = nvml_workers.nvml_errors._blocking.calling
    slot.call_since = time.perf_counter()
    done.wait(10)
    slot.call_since = None


def probe_jobs(jobs, log, tripping: set[int]):
    """The jobs, each waiting inside an "NVML call" (the refresh passes a read that waits in
    one for RELAY_SECONDS) until every job has started; those in tripping first tell their
    probe of one call that waited BLOCKED_SECONDS (as errors._timed does after such a call).
    A job never started leaves them all waiting until the 10 s backstop."""
    release = threading.Event()
    lock = threading.Lock()

    def make(i: int):
        def run() -> int:
            with lock:
                log.append((i, threading.current_thread().name))
                if len(log) == len(jobs):
                    release.set()
            if i in tripping:
                nvml_workers.nvml_errors._blocking.notify(nvml_workers.BLOCKED_SECONDS)
            inside_a_call(release)
            return i
        return run

    return [(slot, make(i)) for i, (slot, _) in enumerate(jobs)]


def test_two_reads_that_trip_give_every_gpu_left_a_reader(monkeypatch):
    # GPU 0 trips and waits: the refresh passes it (RELAY_SECONDS) to GPU 1, which trips too
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    with chain_jobs(6) as (readers, jobs, log, _):
        chain = readers.run(probe_jobs(jobs, log, {0, 1}), time.monotonic() + 30)
        assert chain.blocked and sorted(chain.tripped) == [0, 1]
        assert [done for _, done, *_ in readers.outcome(chain)] == [True] * 6
        assert len({name for _, name in log}) == 6  # every read had its own reader, at once


def test_one_read_that_trips_is_not_yet_a_driver_that_blocks(monkeypatch):
    # a read preempted inside a call (or waiting for the GIL as it returns) trips alone: the
    # chain goes on one reader at a time (passed by the refresh's timer while each waits)
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    with chain_jobs(4) as (readers, jobs, log, _):
        chain = readers.run(probe_jobs(jobs, log, {0}), time.monotonic() + 30)
        assert (chain.blocked, chain.at_once, chain.tripped) == (False, False, [0])
        assert [done for _, done, *_ in readers.outcome(chain)] == [True] * 4
        starts = Starts()
        starts.learn(chain)
        assert not starts.at_once()
        assert (starts.expect, starts.alone) == (False, {0})  # a trip of another GPU next time is enough


def test_one_trip_right_after_a_refresh_that_found_the_driver_blocking_spreads(monkeypatch):
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    monkeypatch.setattr(nvml_workers, "RELAY_SECONDS", 30.0)  # only the probe can pass GPU 0
    with chain_jobs(5) as (readers, jobs, log, _):
        chain = readers.run(probe_jobs(jobs, log, {0}), time.monotonic() + 30, expect=True)
        assert chain.blocked
        assert len({name for _, name in log}) == 5


def test_one_trip_right_after_another_gpu_tripped_alone_spreads(monkeypatch):
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    monkeypatch.setattr(nvml_workers, "RELAY_SECONDS", 30.0)  # only the probe can pass GPU 0
    with chain_jobs(5) as (readers, jobs, log, _):
        chain = readers.run(probe_jobs(jobs, log, {0}), time.monotonic() + 30, alone=frozenset({3}))
        assert chain.blocked
        assert len({name for _, name in log}) == 5


def test_the_same_gpu_tripping_again_is_one_slow_gpu_not_a_driver_that_blocks(monkeypatch):
    # GPU 0 trips on every refresh: the refresh's timer passes it, the others read in a chain
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    with chain_jobs(4) as (readers, jobs, log, _):
        chain = readers.run(probe_jobs(jobs, log, {0}), time.monotonic() + 30, alone=frozenset({0}))
        assert (chain.blocked, chain.tripped) == (False, [0])
        assert [done for _, done, *_ in readers.outcome(chain)] == [True] * 4


def test_a_refresh_that_started_no_read_keeps_what_was_learnt():
    starts = Starts()
    blocked = nvml_workers.Chain([(GpuSlot(0), lambda: 0)], False)
    blocked.blocked = True
    starts.learn(blocked)
    assert starts.expect
    for _ in range(nvml_workers.PROBE_EVERY - 1):
        assert starts.at_once()
        starts.learn(nvml_workers.Chain([(GpuSlot(0), lambda: 0)], True))  # all at once: probes nothing
    assert not starts.at_once()
    starts.learn(nvml_workers.Chain([(GpuSlot(0), lambda: 0)], False))  # every GPU still busy: no read started
    assert starts.expect
    probed = nvml_workers.Chain([(GpuSlot(0), lambda: 0)], False)
    probed.started[0] = True  # a chain that read and did not trip: the driver answers at once again
    starts.learn(probed)
    assert (starts.expect, starts.alone) == (False, frozenset())


def test_a_passed_reader_leaves_the_chain_to_the_one_lent_after_it(monkeypatch):
    # GPU 0's read waits in a call: the chain goes on with another reader, and when the read
    # returns its reader starts nothing more (two readers taking turns would hand the GIL to
    # each other at every call for the rest of the refresh)
    monkeypatch.setattr(nvml_workers, "STALL_SECONDS", 30.0)
    with chain_jobs(8) as (readers, jobs, log, _):
        gate = threading.Event()
        slot0 = jobs[0][0]

        def waits() -> int:
            log.append((0, threading.current_thread().name))
            inside_a_call(gate)  # passed by the refresh's timer while it waits here
            return 0

        def second() -> int:
            # GPU 0 was passed (this read runs): let it return, and wait until its reader has
            # decided whether to take the next GPU (done under the lock that frees its slot)
            log.append((1, threading.current_thread().name))
            gate.set()
            deadline = time.monotonic() + 10
            while slot0.busy and time.monotonic() < deadline:
                time.sleep(0.001)
            return 1

        jobs = [(slot0, waits), (jobs[1][0], second), *jobs[2:]]
        chain = readers.run(jobs, time.monotonic() + 30)
        assert [done for _, done, *_ in readers.outcome(chain)] == [True] * 8
        first = log[0][1]
        assert [i for i, name in log if name == first] == [0]  # GPU 0's reader read GPU 0 only
        assert len({name for _, name in log}) == 2  # and one reader all the others


def test_a_driver_found_blocking_is_read_all_at_once_for_the_next_refreshes():
    starts = Starts()
    modes = []
    for k in range(10):
        at_once = starts.at_once()
        modes.append("at once" if at_once else "chain")
        chain = nvml_workers.Chain([], at_once)
        chain.blocked = k == 1  # the probes of the second refresh found the driver blocking
        starts.learn(chain)
    expected_at_once = nvml_workers.PROBE_EVERY - 1
    assert modes[:2] == ["chain", "chain"]
    assert modes[2 : 2 + expected_at_once] == ["at once"] * expected_at_once
    assert modes[2 + expected_at_once :] == ["chain"] * (8 - expected_at_once)
