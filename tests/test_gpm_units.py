"""The GPM window rules of exporter/backends/nvml/gpm.py, in process against the fake through
the real pynvml, with the reader's clock under the test's control (no sleeping for windows):
the first refresh serves nothing, a refresh less than 1 s after the kept sample reuses the
older one, a changed instance starts afresh, and the values are converted as the contract
says (percent / 100 clamped, NaN and per-metric errors absent, MiB/s x 1048576)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pynvml
import pytest

from resmon_exporter.backends.nvml.gpm import MAX_WINDOW, MIN_WINDOW, GpmReader, convert
from resmon_exporter.backends.nvml.health import HealthReader
from fakenvml import MIB, Scenario, load_in_process


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gpu(fake_libs, tmp_path_factory, tmp_path, monkeypatch):
    """(handle, reader, ask, clock, scenario) for one H200 with GPM; NVML shut down after."""
    trace = load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    scenario = Scenario(tmp_path / "gpm.txt", {"gpu.0.gpm": 1, "gpu.0.gpm.2": 40, "gpu.0.gpm.21": "window"})
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    pynvml.nvmlInit()
    clock = Clock()
    reader = GpmReader(logging.getLogger("test"), clock=clock)
    ask = HealthReader(logging.getLogger("test")).ask
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = trace.counts()
    yield SimpleNamespace(handle=handle, reader=reader, ask=ask, clock=clock, scenario=scenario, trace=trace, before=before)
    reader.free_all()
    pynvml.nvmlShutdown()


def window(sample) -> float:
    """The fake's window metric (GPM 21, PCIe receive) in the fake's own seconds."""
    return dict(((link, d), v) for link, d, v in sample.bandwidths)[("pcie", "receive")] / MIB


def test_first_refresh_nothing_then_a_fast_refresh_keeps_the_older_baseline(gpu):
    spans: dict[float, tuple[float, float]] = {}  # at -> (start, end) of its read, real time

    def read(at: float):
        gpu.clock.now = 1000.0 + at
        time.sleep(0.02)  # the fake's own clock moves between samples
        start = time.monotonic()
        try:
            return gpu.reader.read("k", gpu.handle, gpu.ask)
        finally:
            spans[at] = (start, time.monotonic())

    def diffed_against(sample, at: float, base: float) -> bool:
        # the fake took each sample within its read: a window of the sample at `at` diffed
        # against the one at `base` lies between these two spans (however a busy machine
        # stretched the reads: comparing the windows with each other failed once in a parallel
        # run, 0.163 s for the shorter after a preempted read)
        (new_start, new_end), (old_start, old_end) = spans[at], spans[base]
        return new_start - old_end - 0.005 <= window(sample) <= new_end - old_start + 0.005

    assert gpu.reader.supported("k", gpu.handle, gpu.ask)
    assert read(0.0) is None  # the first refresh: one sample, no window
    for at in (0.3, 0.6, 0.9):  # faster than a second: still no sample 1 s older
        assert read(at) is None
    first = read(1.1)  # kept: the samples at 0.0 and 1.1
    assert first is not None and dict(first.ratios) == {"sm_active": 0.4}
    assert diffed_against(first, 1.1, 0.0), (window(first), spans)
    later = dict((at, read(at)) for at in (1.4, 1.7, 2.0, 2.3))
    # 1.4 .. 2.0 diff against the sample at 0.0 (the one at 1.1 is less than 1 s old): the
    # window grows with every refresh instead of shrinking to the time since the last one
    for at in (1.4, 1.7, 2.0):
        assert diffed_against(later[at], at, 0.0), (at, window(later[at]), spans)
    # at 2.3 the sample at 1.1 is 1.2 s old: the newer baseline
    assert diffed_against(later[2.3], 2.3, 1.1), (window(later[2.3]), spans)
    later = list(later.values())
    assert all(dict(s.ratios) == {"sm_active": 0.4} for s in later)
    allocated = gpu.trace.counts()["nvmlGpmSampleAlloc"] - gpu.before["nvmlGpmSampleAlloc"]
    assert allocated == 3  # two kept, one being taken: never more, however many refreshes


def test_the_baseline_is_the_newest_sample_at_least_min_window_older(gpu):
    reader, clock = gpu.reader, gpu.clock
    bases = []
    real = reader._compute

    def spy(key, ask, older, newer):
        kept = reader._sources[("k", None)].kept
        bases.append(next(round(t - 1000.0, 3) for t, b in kept if b is older))
        return real(key, ask, older, newer)

    reader._compute = spy
    for t in (0.0, 0.5, 1.2, 1.5, 2.1, 2.5, 4.0):
        clock.now = 1000.0 + t
        reader.read("k", gpu.handle, gpu.ask)
    # no baseline at 0.0 and 0.5; at 2.1 the sample at 1.2 is 0.9 s old, so 0.0 still serves
    assert bases == [0.0, 0.0, 0.0, 1.2, 2.5]
    # kept: samples at least MIN_WINDOW apart, two at most (2.5 pushed 0.0 out, 4.0 pushed 1.2)
    assert [round(t - 1000.0, 3) for t, _ in reader._sources[("k", None)].kept] == [2.5, 4.0]
    assert MIN_WINDOW == 1.0


def test_a_changed_instance_starts_afresh(gpu):
    read = lambda tag: gpu.reader.read("k", gpu.handle, gpu.ask, tag=tag)  # noqa: E731
    assert read("a") is None
    gpu.clock.now += 1.5
    assert read("a") is not None
    gpu.clock.now += 1.5
    assert read("b") is None  # another instance under the same key: its first sample
    gpu.clock.now += 1.5
    assert read("b") is not None


def test_a_refused_sample_holds_one_buffer_and_no_window(gpu):
    gpu.scenario.update(**{"gpu.0.rc.nvmlGpmSampleGet": 3})
    assert gpu.reader.read("k", gpu.handle, gpu.ask) is None
    gpu.clock.now += 5
    assert gpu.reader.read("k", gpu.handle, gpu.ask) is None
    assert gpu.trace.counts()["nvmlGpmSampleAlloc"] - gpu.before["nvmlGpmSampleAlloc"] == 1


def allocated(gpu) -> int:
    return gpu.trace.counts()["nvmlGpmSampleAlloc"] - gpu.before["nvmlGpmSampleAlloc"]


def test_a_sample_older_than_max_window_is_never_a_baseline(gpu):
    read = lambda: gpu.reader.read("k", gpu.handle, gpu.ask)  # noqa: E731
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is not None
    gpu.clock.now += MAX_WINDOW + 1  # both kept samples too old: dropped, this one the first again
    assert read() is None
    assert len(gpu.reader._sources[("k", None)].kept) == 1
    gpu.clock.now += 1.5
    assert read() is not None
    assert allocated(gpu) == 3  # the dropped ones were reused


def test_a_device_that_went_down_starts_afresh(gpu):
    read = lambda: gpu.reader.read("k", gpu.handle, gpu.ask)  # noqa: E731
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is not None
    gpu.reader.drop("k")  # the backend marked it down (it may have been reset meanwhile)
    gpu.clock.now += 1.5
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is not None
    assert allocated(gpu) == 2  # the two dropped samples were reused


def test_a_missing_symbol_turns_off_what_needs_it_until_the_next_init(gpu):
    read = lambda **kw: gpu.reader.read("k", gpu.handle, gpu.ask, **kw)  # noqa: E731
    gpu.scenario.update(**{"gpu.0.rc.nvmlGpmMigSampleGet": 13})  # FUNCTION_NOT_FOUND: R520
    assert read(instance=1, tag="a") is None
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is not None  # the whole GPU's samples still work
    gpu.scenario.update(**{"gpu.0.rc.nvmlGpmMigSampleGet": None, "gpu.0.rc.nvmlGpmSampleGet": 13})
    gpu.clock.now += 1.5
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is None and gpu.reader.supported("k", gpu.handle, gpu.ask)  # off until the next init
    gpu.scenario.update(**{"gpu.0.rc.nvmlGpmSampleGet": None})
    gpu.reader.free_all()  # before nvmlShutdown / after a new nvmlInit: the symbols are asked again
    assert gpu.reader.supported("k", gpu.handle, gpu.ask)
    assert read() is None
    gpu.clock.now += 1.5
    assert read() is not None


def test_a_library_fault_in_a_sample_call_keeps_the_buffer(gpu):
    from resmon_exporter.backends.nvml.errors import BackendDown

    read = lambda: gpu.reader.read("k", gpu.handle, gpu.ask)  # noqa: E731
    assert read() is None
    gpu.scenario.update(**{"gpu.0.rc.nvmlGpmSampleGet": 1})  # UNINITIALIZED
    with pytest.raises(BackendDown):
        read()
    source = gpu.reader._sources[("k", None)]
    assert len(source.spare) + len(source.kept) == allocated(gpu) == 2  # none lost between the lists
    gpu.reader.free_all()
    assert gpu.trace.counts()["nvmlGpmSampleFree"] - gpu.before["nvmlGpmSampleFree"] == 2


def metric(mid: int, value: float, rc: int = 0) -> SimpleNamespace:
    return SimpleNamespace(metricId=mid, nvmlReturn=rc, value=value)


def test_convert_clamps_drops_nan_and_errors_and_scales_bandwidth():
    answer = SimpleNamespace(metrics=[metric(2, 130.0), metric(3, -4.0), metric(5, float("nan")), metric(10, 50.0, rc=3),
                                      metric(12, 25.5), metric(20, 2.5), metric(21, -1.0), metric(61, float("inf"))])
    sample = convert(answer, len(answer.metrics))
    assert dict(sample.ratios) == {"sm_active": 1.0, "sm_occupancy": 0.0, "fp32_active": 0.255}
    assert sample.bandwidths == (("pcie", "transmit", 2.5 * MIB),)
    assert convert(SimpleNamespace(metrics=[metric(2, 1.0, rc=999)]), 1) is None  # nothing left: no sample


def test_dropping_while_other_workers_add_sources_neither_raises_nor_loses_buffers(monkeypatch):
    # GPUs are read on parallel workers while a GPU going down drops its windows: the
    # bookkeeping is shared (a dict changing size under drop's loop failed the whole refresh)
    import sys
    import threading

    allocated: list[object] = []
    freed: list[object] = []

    def ask(key, what, fn, *args, **kwargs):
        if what == "gpm_alloc":
            allocated.append(object())
            return allocated[-1]
        return 1 if what.startswith(("gpm_sample", "gpm_mig_sample")) else None

    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", freed.append)
    reader = GpmReader(logging.getLogger("test"))
    reader.read("k0", None, ask)  # k0: a source with a kept sample
    errors: list[BaseException] = []

    def guarded(body):
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # handed to the test's thread
                errors.append(exc)
        return run

    def adder() -> None:
        for n in range(1, 2001):
            reader.read(f"k{n}", None, ask, instance=n % 7)
            reader.read("k0", None, ask)

    def dropper() -> None:
        for _ in range(2000):
            reader.drop("k0")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=guarded(f)) for f in (adder, dropper)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert not errors
    reader.free_all()
    assert len(freed) == len(allocated) and set(map(id, freed)) == set(map(id, allocated))
