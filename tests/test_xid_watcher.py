"""The XID watcher in-process: the real pynvml against the fake libnvidia-ml loaded into this
process, events injected through the scenario's xid_events list. Waits are polled with a
bounded deadline; the only timing assertions are bounds the code promises (stop() joins
within about one wait, a rebuild waits at least its backoff)."""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from resmon_exporter.backends.nvml.xid import THREAD_NAME, XidWatcher
from resmon_exporter.samples import XidState
from fakenvml import Scenario, Trace, load_in_process
from scenarios import GPU_IS_LOST, three_gpus

UUIDS = [three_gpus()[f"gpu.{i}.uuid"] for i in range(3)]
A, B, C = UUIDS


@pytest.fixture
def nvml(fake_libs, tmp_path_factory, tmp_path, monkeypatch) -> Iterator[tuple[Scenario, Trace]]:
    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    trace.clear()
    scenario = Scenario(tmp_path / "scenario.txt", three_gpus())
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    pynvml.nvmlInit()
    try:
        yield scenario, trace
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture
def make(log) -> Iterator[Any]:
    """make(**kwargs) -> an XidWatcher with the test's logger, stopped at teardown (before the
    nvml fixture's nvmlShutdown, as the backend does)."""
    made: list[XidWatcher] = []

    def build(**kwargs: Any) -> XidWatcher:
        kwargs.setdefault("wait_ms", 100)
        watcher = XidWatcher(log[0], **kwargs)
        made.append(watcher)
        return watcher

    yield build
    for watcher in made:
        assert watcher.stop(5.0)


def devices() -> dict[str, Any]:
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    return {pynvml.nvmlDeviceGetUUID(h): h for h in handles}


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.01)


def inject(scenario: Scenario, *events: tuple[str, int]) -> None:
    """Append to the cumulative xid_events list: each new entry is delivered once."""
    old = [e for e in str(scenario.values.get("xid_events", "")).split(",") if e]
    scenario.update(xid_events=",".join(old + [f"{uuid}:{code}" for uuid, code in events]))


def counts(state: XidState) -> dict[tuple[str, int], int]:
    return {(c.uuid, c.xid): c.count for c in state.counts}


def received(watcher: XidWatcher, scenario: Scenario, marker: tuple[str, int] = (C, 31)) -> dict[tuple[str, int], int]:
    """The counts once everything injected so far has come in: events reach a set in order,
    so once a marker event injected last is counted, every earlier one was too. The marker's
    own key is left out (tests never inject it otherwise)."""
    before = counts(watcher.state()).get(marker, 0)
    inject(scenario, marker)
    wait_until(lambda: counts(watcher.state()).get(marker, 0) == before + 1, what="marker event counted")
    return {k: v for k, v in counts(watcher.state()).items() if k != marker}


def builds(trace: Trace) -> int:
    """Registrations that are complete: the watcher waits only once its set is built, so a
    wait after the n-th nvmlEventSetCreate means build n is done."""
    done, building = 0, False
    for symbol, _ in trace.lines():
        if symbol == "nvmlEventSetCreate":
            building = True
        elif symbol == "nvmlEventSetWait_v2" and building:
            done, building = done + 1, False
    return done


def xid_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


# -- counting ---------------------------------------------------------------------------


def test_counts_rise_by_exactly_what_was_injected_per_uuid_and_code(nvml, make, log):
    scenario, _ = nvml
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: watcher.state().watched == frozenset(UUIDS), what="all GPUs watched")
    before = time.time()
    inject(scenario, (A, 79), (B, 48), (A, 79), (A, 13), (C, 999))
    inject(scenario, (A, 79))
    assert received(watcher, scenario) == {(A, 79): 3, (A, 13): 1, (B, 48): 1, (C, 999): 1}
    after = time.time()
    state = watcher.state()
    assert state.healthy and state.duration_seconds > 0
    for c in state.counts:
        assert before <= c.last_seen_seconds <= after
    unknown = next(c for c in state.counts if c.uuid == C and c.xid == 999)
    assert str(unknown.xid) == "999"  # NVML's "unknown XID" is a code like any other
    # one info line per XID, nothing else per event
    xid_lines = [r for r in log[1].records if r.getMessage() == "XID event"]
    assert len(xid_lines) == 7 and all(r.levelno == logging.INFO for r in xid_lines)
    assert {(r.resmon_fields["uuid"], r.resmon_fields["xid"]) for r in xid_lines} >= {(A, 79), (C, 999)}
    assert not [r for r in log[1].records if r.levelno >= logging.WARNING]


def test_events_before_registration_are_not_replayed(nvml, make):
    scenario, _ = nvml
    inject(scenario, (A, 79))
    devices()  # the fake has now seen (and dropped) that entry: no set exists yet
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: watcher.state().watched == frozenset(UUIDS))
    assert received(watcher, scenario) == {}


def test_a_reenumerated_gpu_keeps_its_events_by_uuid(nvml, make):
    scenario, trace = nvml
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1, what="first registration")
    # a driver reload put A at index 1 and B at index 0: same handles, other GPUs
    scenario.update(**{"gpu.0.uuid": B, "gpu.1.uuid": A})
    swapped = devices()
    assert pynvml.nvmlDeviceGetIndex(swapped[A]) == 1
    watcher.watch(swapped)  # attributed by the UUID at receipt: right at once, no rebuild
    inject(scenario, (A, 79), (A, 79), (B, 48))
    assert received(watcher, scenario) == {(A, 79): 2, (B, 48): 1}
    watcher.watch(devices())  # the same mapping again
    inject(scenario, (B, 48))
    assert received(watcher, scenario) == {(A, 79): 2, (B, 48): 2}
    assert builds(trace) == 1  # the live set was kept: nothing queued on it was dropped


def test_an_unchanged_mapping_makes_no_nvml_call_and_no_rebuild(nvml, make):
    _, trace = nvml
    watcher = make()
    now = devices()
    watcher.watch(now)
    wait_until(lambda: builds(trace) == 1)
    before = [line for line in trace.lines() if line[0] != "nvmlEventSetWait_v2"]
    for _ in range(100):
        watcher.watch(dict(now))  # equal handles are other POINTER objects: compared by address
    waits = trace.count("nvmlEventSetWait_v2")
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") >= waits + 2, what="the thread waited on")
    assert [line for line in trace.lines() if line[0] != "nvmlEventSetWait_v2"] == before


# -- unsupported and failing GPUs ----------------------------------------------------------


def test_a_gpu_without_xid_support_is_skipped_and_not_unhealthy(nvml, make, log):
    scenario, trace = nvml
    scenario.update(**{"gpu.1.xid_supported": 0})  # a GeForce board
    assert pynvml.nvmlDeviceGetSupportedEventTypes(pynvml.nvmlDeviceGetHandleByIndex(1)) == 0
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    state = watcher.state()
    assert state.watched == frozenset({A, C}) and state.healthy
    inject(scenario, (B, 79), (A, 13))
    assert received(watcher, scenario) == {(A, 13): 1}
    assert trace.count("nvmlDeviceRegisterEvents", device=1) == 1
    assert not [r for r in log[1].records if r.levelno >= logging.WARNING]


def test_only_geforce_boards_means_no_set_and_no_wakeups(nvml, make):
    scenario, trace = nvml
    scenario.update(**{f"gpu.{i}.xid_supported": 0 for i in range(3)})
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: trace.count("nvmlEventSetFree") == 1, what="the empty set freed")
    assert watcher.state() == XidState(healthy=True, duration_seconds=watcher.state().duration_seconds)
    assert trace.count("nvmlEventSetWait_v2") == 0
    assert len(xid_threads()) == 1  # idle on a condition, not polling


def test_a_lost_gpu_on_wait_rebuilds_with_backoff_and_counts_again(nvml, make, log, monkeypatch):
    scenario, trace = nvml
    scenario.update(**{"gpu.1.xid_supported": 0})  # skipped once, never retried as an error
    created: list[float] = []
    real_create = pynvml.nvmlEventSetCreate

    def create() -> Any:
        created.append(time.monotonic())
        return real_create()

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", create)
    watcher = make(wait_ms=100, min_backoff=0.05, max_backoff=0.4)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    inject(scenario, (A, 79))
    assert received(watcher, scenario) == {(A, 79): 1}

    scenario.update(**{"rc.nvmlEventSetWait_v2": GPU_IS_LOST})  # also ends the wait in progress
    wait_until(lambda: not watcher.state().healthy, what="unhealthy after GPU_IS_LOST")
    wait_until(lambda: len(created) >= 6, what="five rebuilds")  # each fails at its first wait
    assert not watcher.state().healthy
    gaps = [b - a for a, b in itertools.pairwise(created[1:])]
    for i, gap in enumerate(gaps):  # 0.05 doubling to 0.4: each rebuild waits at least its backoff
        assert gap >= min(0.1 * 2**i, 0.4) - 0.005, gaps
    warnings = [r for r in log[1].records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per failure mode
    assert warnings[0].resmon_fields["step"] == "wait"

    scenario.update(**{"rc.nvmlEventSetWait_v2": None})
    wait_until(lambda: watcher.state().healthy, what="healthy again")
    assert watcher.state().watched == frozenset({A, C})
    assert [r for r in log[1].records if r.getMessage() == "XID watching resumed"]
    inject(scenario, (A, 79), (C, 48))
    assert received(watcher, scenario) == {(A, 79): 2, (C, 48): 1}  # counts survived the rebuilds
    assert trace.count("nvmlDeviceRegisterEvents", device=1) == 1
    assert trace.count("nvmlEventSetCreate") == trace.count("nvmlEventSetFree") + 1  # no set leaked


@pytest.mark.parametrize("code", [GPU_IS_LOST, 999])
def test_a_failed_registration_keeps_the_others_and_is_retried(nvml, make, log, code):
    scenario, trace = nvml
    scenario.update(**{"gpu.2.rc.nvmlDeviceRegisterEvents": code})
    watcher = make(min_backoff=0.05, max_backoff=0.1)
    watcher.watch(devices())
    wait_until(lambda: trace.count("nvmlDeviceRegisterEvents", device=2) >= 3, what="retries")
    state = watcher.state()
    if code == GPU_IS_LOST:  # that GPU is down (the backend says so): the watcher is not failing
        assert state.healthy and state.watched == frozenset({A, B})
    else:  # UNKNOWN: the set is undefined (header), so it is rebuilt whole
        assert not state.healthy and state.watched == frozenset()
    scenario.update(**{"gpu.2.rc.nvmlDeviceRegisterEvents": None})
    wait_until(lambda: watcher.state().healthy and watcher.state().watched == frozenset(UUIDS))
    inject(scenario, (C, 79))
    assert received(watcher, scenario, marker=(A, 31)) == {(C, 79): 1}
    warnings = [r for r in log[1].records if r.levelno >= logging.WARNING]
    assert len(warnings) == (0 if code == GPU_IS_LOST else 1)


def test_unknown_from_registering_a_new_gpu_rebuilds_the_set(nvml, make):
    # a GPU that appears later joins the live set; UNKNOWN leaves that set undefined (header)
    scenario, trace = nvml
    watcher = make(min_backoff=0.05, max_backoff=0.1)
    first = devices()
    watcher.watch({A: first[A], B: first[B]})
    wait_until(lambda: builds(trace) == 1)
    scenario.update(**{"gpu.2.rc.nvmlDeviceRegisterEvents": 999})
    watcher.watch(first)
    wait_until(lambda: not watcher.state().healthy)
    wait_until(lambda: trace.count("nvmlEventSetFree") >= 1, what="the undefined set freed")
    scenario.update(**{"gpu.2.rc.nvmlDeviceRegisterEvents": None})
    wait_until(lambda: watcher.state().healthy and watcher.state().watched == frozenset(UUIDS))
    assert builds(trace) >= 2


def test_a_lost_library_is_rebuilt_once_nvml_is_back(nvml, make):
    scenario, trace = nvml
    watcher = make(min_backoff=0.05, max_backoff=0.1)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    scenario.update(**{"rc.nvmlEventSetWait_v2": 1})  # UNINITIALIZED: the library went away
    wait_until(lambda: not watcher.state().healthy)
    scenario.update(**{"rc.nvmlEventSetWait_v2": None})
    wait_until(lambda: watcher.state().healthy, what="healthy again")
    inject(scenario, (B, 43))
    assert received(watcher, scenario) == {(B, 43): 1}


# -- lifecycle ----------------------------------------------------------------------------


def test_stop_joins_within_a_wait_and_watch_starts_exactly_one_thread(nvml, make):
    _, trace = nvml
    watcher = make(wait_ms=400)
    assert xid_threads() == []
    watcher.watch(devices())
    assert len(xid_threads()) == 1 and xid_threads()[0].daemon
    wait_until(lambda: builds(trace) == 1)
    started = time.monotonic()
    assert watcher.stop(5.0)
    assert time.monotonic() - started < 0.4 + 1.0  # one wait of at most wait_ms, plus slack
    assert xid_threads() == []
    assert watcher.state().watched == frozenset()
    watcher.watch(devices())
    watcher.watch(devices())
    assert len(xid_threads()) == 1


def test_repeated_stop_and_watch_do_not_grow_the_threads(nvml, make):
    scenario, trace = nvml
    watcher = make(wait_ms=50)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    baseline = threading.active_count()
    for cycle in range(2, 8):
        assert watcher.stop(5.0)
        watcher.watch(devices())
        assert len(xid_threads()) == 1
        wait_until(lambda n=cycle: builds(trace) == n)
    assert threading.active_count() == baseline
    assert trace.count("nvmlEventSetCreate") == trace.count("nvmlEventSetFree") + 1
    inject(scenario, (A, 79))
    assert received(watcher, scenario) == {(A, 79): 1}


def test_stop_frees_the_set_before_nvml_shutdown_and_counts_survive_a_reinit(nvml, make):
    scenario, trace = nvml
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    inject(scenario, (A, 79))
    assert received(watcher, scenario) == {(A, 79): 1}
    assert watcher.stop(5.0)
    pynvml.nvmlShutdown()  # what the backend does after a stop() that returned True
    symbols = [s for s, _ in trace.lines()]
    assert symbols.count("nvmlEventSetFree") == 1
    assert symbols.index("nvmlEventSetFree") < symbols.index("nvmlShutdown")
    pynvml.nvmlInit()  # re-init (the fixture's shutdown balances it)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 2)
    inject(scenario, (A, 79))
    assert received(watcher, scenario) == {(A, 79): 2}


def test_a_stop_that_times_out_never_leaves_two_threads(nvml, make):
    scenario, trace = nvml
    watcher = make(wait_ms=100)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    scenario.update(**{"delay_ms.nvmlEventSetWait_v2": 600})  # a wedged driver
    waits = trace.count("nvmlEventSetWait_v2")
    # the second wait entered after the change is surely one that sleeps 0.6 s
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") >= waits + 2, what="a delayed wait")
    assert not watcher.stop(0.05)
    watcher.watch(devices())
    assert len(xid_threads()) == 1  # the old one, still stopping: never a second
    scenario.update(**{"delay_ms.nvmlEventSetWait_v2": None})
    wait_until(lambda: not xid_threads(), what="the stopped thread ended")
    watcher.watch(devices())
    assert len(xid_threads()) == 1



def test_stop_with_on_exit_returns_at_once_and_the_thread_calls_back_once_out_of_nvml(nvml, make):
    # what the backend's close() does: no waiting out a wait (close stays prompt); the
    # watcher, on its way out, tells the backend that NVML may now be shut down
    scenario, trace = nvml
    watcher = make(wait_ms=100)
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    scenario.update(**{"delay_ms.nvmlEventSetWait_v2": 800})
    waits = trace.count("nvmlEventSetWait_v2")
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") >= waits + 2, what="a delayed wait")
    seen: list[tuple[list[str], bool, str]] = []

    def on_exit() -> None:  # on the watcher's own thread: stop() from it must answer, not join itself
        seen.append(([s for s, _ in trace.lines()], watcher.stop(0.0), threading.current_thread().name))

    assert not watcher.stop(0.0, on_exit=on_exit)  # inside its 0.8 s wait: not done yet
    assert len(xid_threads()) == 1 and seen == []
    wait_until(lambda: seen, what="the on_exit call")
    symbols, stopped, thread = seen[0]
    assert stopped is True and thread == THREAD_NAME
    assert symbols.count("nvmlEventSetFree") == 1 and symbols[-1] == "nvmlEventSetFree"  # freed, then told
    wait_until(lambda: not xid_threads(), what="the stopped thread ended")
    assert len(seen) == 1
    scenario.update(**{"delay_ms.nvmlEventSetWait_v2": None})
    watcher.watch(devices())  # a new thread does not inherit the old callback
    wait_until(lambda: builds(trace) == 2)
    assert watcher.stop(5.0) and len(seen) == 1


def test_stop_interrupts_a_long_wait_and_an_event_still_ends_one_at_once(nvml, make):
    # issue 35: 5 s waits (the contract's bound; the default) make one wakeup per 5 s while
    # idle; an event still ends a wait at once, and stop() ends one with WAKE_SIGNAL
    scenario, trace = nvml
    watcher = make(wait_ms=60_000)  # clamped to the contract's 5 s
    watcher.watch(devices())
    wait_until(lambda: builds(trace) == 1)
    waits = trace.count("nvmlEventSetWait_v2")
    inject(scenario, (A, 79))
    injected = time.monotonic()
    wait_until(lambda: counts(watcher.state()).get((A, 79)) == 1, what="the event counted")
    assert time.monotonic() - injected < 2.5  # the wait returned with it, not at its timeout
    assert trace.count("nvmlEventSetWait_v2") <= waits + 2  # that wait, and the next one begun
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") == waits + 1 and watcher._waiting, what="inside a wait")
    started = time.monotonic()
    assert watcher.stop(10.0)
    assert time.monotonic() - started < 2.5  # not the rest of a 5 s wait
    assert xid_threads() == []
    assert trace.lines()[-1][0] == "nvmlEventSetFree"


def test_a_forgotten_gpu_loses_its_counts_and_its_late_events_until_it_is_back(nvml, make):
    # issue 35: the backend forgets a GPU gone for long; its xid series must go with it, and
    # an event it still raises (it stays registered: NVML has no unregister) is not counted
    scenario, _ = nvml
    watcher = make()
    watcher.watch(devices())
    wait_until(lambda: watcher.state().watched == frozenset(UUIDS))
    inject(scenario, (A, 79), (B, 48))
    assert received(watcher, scenario) == {(A, 79): 1, (B, 48): 1}
    watcher.forget(A)
    assert received(watcher, scenario) == {(B, 48): 1}
    inject(scenario, (A, 79))  # a late event of the forgotten GPU
    assert received(watcher, scenario) == {(B, 48): 1}
    watcher.watch(devices())  # the same mapping: A is enumerated again, counted anew from 0
    inject(scenario, (A, 13))
    assert received(watcher, scenario) == {(A, 13): 1, (B, 48): 1}


# -- the fake's event sets themselves ----------------------------------------------------


def test_fake_event_sets_follow_the_header(nvml):
    scenario, trace = nvml
    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h0) == pynvml.nvmlEventTypeXidCriticalError
    es = pynvml.nvmlEventSetCreate()
    # an unsupported bit: NOT_SUPPORTED and nothing registered
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError, es)
    inject(scenario, (A, 79))
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)  # a poll
    pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.setdefault("first", pynvml.nvmlEventSetWait_v2(es, 5000)))
    waits = trace.count("nvmlEventSetWait_v2")
    started = time.monotonic()
    waiter.start()
    wait_until(lambda: trace.count("nvmlEventSetWait_v2") > waits, what="the wait entered")
    inject(scenario, (A, 79), (A, 999))  # the blocked wait re-reads the scenario itself
    waiter.join(10)
    assert time.monotonic() - started < 2.5  # not the 5 s timeout
    first = result["first"]
    second = pynvml.nvmlEventSetWait_v2(es, 0)  # one event per call
    assert (first.eventType, first.eventData, second.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79, 999)
    assert (first.gpuInstanceId, first.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert ctypes.cast(first.device, ctypes.c_void_p).value == ctypes.cast(h0, ctypes.c_void_p).value
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 200)
    assert 0.19 <= time.monotonic() - started < 1.5
    # after the last nvmlShutdown every set is gone: a stale set is an error, never a crash
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlEventSetWait_v2(es, 0)
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(es, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
