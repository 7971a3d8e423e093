"""The two pieces of arithmetic under the health families, on their own: field-value decoding
(per-entry status, value types, the mislabelled double, sentinels) and busy-time
integration (each sample once, the gap rule, a restarted driver clock)."""

from __future__ import annotations

import struct

import pynvml
import pytest

from resmon_exporter.backends.nvml.busy import BusyIntegrator
from resmon_exporter.backends.nvml.fields import decode, in_range


def entry(value_type: int, member: str, value: float | int, rc: int = 0) -> pynvml.c_nvmlFieldValue_t:
    e = pynvml.c_nvmlFieldValue_t()
    e.fieldId, e.valueType, e.nvmlReturn = 82, value_type, rc
    setattr(e.value, member, value)
    return e


def test_each_value_type_is_read_from_its_member():
    assert decode(entry(1, "uiVal", 54)) == 54
    assert decode(entry(3, "ullVal", 123_456_789_012)) == 123_456_789_012
    assert decode(entry(4, "sllVal", -5)) == -5
    assert decode(entry(5, "siVal", -7)) == -7
    assert decode(entry(6, "usVal", 300)) == 300
    assert decode(entry(0, "dVal", 61.5)) == 61.5


def test_an_entry_with_its_own_error_has_no_value():
    assert decode(entry(1, "uiVal", 54, rc=pynvml.NVML_ERROR_NOT_SUPPORTED)) is None
    assert decode(entry(1, "uiVal", 54, rc=pynvml.NVML_ERROR_GPU_IS_LOST)) is None
    assert decode(entry(9, "uiVal", 54)) is None  # a value type this code does not know


def test_a_uint_labelled_double_is_read_as_the_uint():
    # r545: memory temperature written as uiVal, valueType DOUBLE; as a double it is 2.7e-322
    e = entry(0, "ullVal", 54)
    assert struct.unpack("<d", struct.pack("<Q", 54))[0] < 1e-300
    assert decode(e) == 54


def test_sentinels_and_non_finite_values_are_absent():
    assert decode(entry(1, "uiVal", 0xFFFFFFFF)) is None
    assert decode(entry(3, "ullVal", 0xFFFFFFFFFFFFFFFF)) is None
    assert decode(entry(3, "ullVal", 0xFFFFFFFF)) == 0xFFFFFFFF  # a 64-bit counter may pass 2**32 - 1
    assert decode(entry(0, "dVal", float("nan"))) is None
    assert decode(entry(0, "dVal", float("inf"))) is None
    assert in_range(1e6, 1, 200) is None and in_range(54, 1, 200) == 54 and in_range(None, 1, 200) is None


def series(start_us: int, step_us: int, values: list[float]) -> list[tuple[int, float]]:
    return [(start_us + i * step_us, v) for i, v in enumerate(values)]


def at(us: int) -> float:
    """A monotonic read time that matches the driver clock of these tests."""
    return us / 1e6


def test_each_sample_counts_once_for_the_interval_before_it():
    busy = BusyIntegrator()
    first = series(1_000_000, 100_000, [50.0] * 10)  # 0.9 s of spacing inside the batch
    assert busy.add("g", "gpu", first, now=at(1_900_000)) == pytest.approx(0.45)
    assert busy.last_seen("g", "gpu") == first[-1][0]
    # the same samples again (a driver ignoring lastSeen), read between two samples: nothing added
    assert busy.add("g", "gpu", first, now=at(1_950_000)) == pytest.approx(0.45)
    nxt = series(first[-1][0] + 100_000, 100_000, [100.0] * 5)  # 0.5 s at 100 %
    assert busy.add("g", "gpu", nxt, now=at(2_400_000)) == pytest.approx(0.95)
    assert busy.add("g", "gpu", [], now=at(2_450_000)) == pytest.approx(0.95)  # nothing newer: unchanged


def test_a_gap_longer_than_the_buffer_is_filled_at_the_mean_of_what_follows():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [0.0, 0.0]), now=at(100_000))
    # 10 s later the buffer holds only its last 1 s: alternating 100/0, mean 50 %
    later = series(10_100_000, 100_000, [100.0, 0.0] * 5)
    total = busy.add("g", "gpu", later, now=at(11_000_000))
    gap_s = (later[0][0] - 100_000) / 1e6
    inside_s = sum(v / 100 * 0.1 for _, v in later[1:])
    assert total == pytest.approx(gap_s * 0.5 + inside_s)
    assert total / (later[-1][0] / 1e6 - 0.1) == pytest.approx(0.5, rel=0.02)


def test_an_idle_stretch_is_not_filled_at_the_busy_mean():
    # an idle GPU's ring runs dry (NOT_FOUND); work that starts later must not be spread
    # back over the idle minutes: the ring (50 samples) is not full, so nothing was lost
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [0.0] * 50), now=at(4_900_000))
    for t in range(10, 600, 15):  # 10 minutes of empty refreshes
        busy.add("g", "gpu", [], now=at(t * 1_000_000))
    burst = series(600_000_000, 100_000, [100.0] * 10)
    assert busy.add("g", "gpu", burst, now=at(600_900_000)) == pytest.approx(1.0)


def test_a_full_ring_gap_is_filled_only_for_the_time_not_looked_at():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [0.0] * 10), now=at(900_000))
    busy.add("g", "gpu", [], now=at(5_000_000))  # looked at 5 s: nothing newer
    full = series(10_000_000, 100_000, [100.0] * 10)  # a full ring again: some was lost
    total = busy.add("g", "gpu", full, now=at(10_900_000))
    assert total == pytest.approx(0.9 + (10_900_000 - 5_000_000 - 900_000) / 1e6)


@pytest.mark.parametrize("hours", [0.5, 2])
def test_hours_unread_are_not_filled_when_samples_come_back(hours):
    # a GPU down, NVML away or MIG mode on: refreshes go on, the engine is not read
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [100.0] * 10), now=at(900_000))
    end = int(hours * 3600e6)
    for t in range(15_000_000, end, 15_000_000):
        busy.unread("g", now=at(t))
    back = series(end, 100_000, [100.0] * 10)  # a full ring when it answers again
    total = busy.add("g", "gpu", back, now=at(end + 900_000))
    assert 0.9 + 0.9 <= total <= 0.9 + 0.9 + 15.1  # at most the last refresh interval filled


def test_a_reinitialised_library_does_not_count_the_buffer_twice():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [100.0] * 11), now=at(1_000_000))  # 1 s
    busy.reset()  # nvmlInit again, the driver's clock went on
    assert busy.last_seen("g", "gpu") == 0  # the whole buffer, to compare
    total = busy.add("g", "gpu", series(0, 100_000, [100.0] * 16), now=at(1_500_000))
    assert total == pytest.approx(1.5)  # only the 5 new samples were added
    assert busy.last_seen("g", "gpu") == 1_500_000


def test_a_paused_ring_after_reinit_is_not_a_restarted_clock():
    busy = BusyIntegrator()
    ring = series(0, 100_000, [100.0] * 11)
    busy.add("g", "gpu", ring, now=at(1_000_000))
    busy.reset()
    assert busy.add("g", "gpu", [], now=at(2_000_000)) == pytest.approx(1.0)  # nothing: still checking
    assert busy.last_seen("g", "gpu") == 0
    assert busy.add("g", "gpu", ring, now=at(3_000_000)) == pytest.approx(1.0)  # the same ring: not again


def test_a_restarted_driver_clock_starts_over_without_going_back():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(50_000_000, 100_000, [100.0] * 3), now=at(50_200_000))
    before = busy.total("g", "gpu")
    busy.reset()
    assert busy.last_seen("g", "gpu") == 0  # ask for the whole new buffer
    after = busy.add("g", "gpu", series(1_000, 100_000, [100.0] * 3), now=at(50_400_000))
    assert after == pytest.approx(before + 0.2)
    assert busy.total("g", "other") is None


def test_non_finite_samples_are_dropped():
    busy = BusyIntegrator()
    total = busy.add("g", "gpu", [(0, 50.0), (100_000, float("nan")), (200_000, 50.0)], now=at(200_000))
    assert total == pytest.approx(0.1)


def test_values_outside_0_to_100_are_clamped():
    busy = BusyIntegrator()
    assert busy.add("g", "gpu", series(0, 1_000_000, [250.0, 250.0]), now=at(1_000_000)) == pytest.approx(1.0)
    assert busy.add("h", "gpu", series(0, 1_000_000, [-5.0, -5.0]), now=at(1_000_000)) == 0.0


def test_not_supported_is_remembered_for_a_while_then_asked_again(monkeypatch):
    # remapped rows answer NOT_SUPPORTED only while MIG instances exist: not for good
    from resmon_exporter.backends.nvml import health as nvml_health
    from resmon_exporter.backends.nvml.errors import DeviceDown

    answers = [None, (2, 0, 0, 0)]
    calls = []

    def remapped(handle):
        calls.append(handle)
        return answers[min(len(calls) - 1, 1)]

    clock = [100.0]
    monkeypatch.setattr(nvml_health.time, "monotonic", lambda: clock[0])
    import logging

    reader = nvml_health.HealthReader(logging.getLogger("test.health"))
    assert reader.ask("g", "remapped", remapped, "h") is None
    assert reader.ask("g", "remapped", remapped, "h") is None and len(calls) == 1  # remembered
    clock[0] += nvml_health.UNSUPPORTED_RECHECK + 1
    assert reader.ask("g", "remapped", remapped, "h") == (2, 0, 0, 0) and len(calls) == 2

    def flaky(handle):
        raise DeviceDown(999, "Unknown Error")

    assert reader.ask("g", "ecc", flaky, "h", part="health") is None  # absent this once, not remembered
    assert ("g", "ecc") not in reader._unsupported
    assert reader.take_failures() == {"health"} and reader.take_failures() == set()  # the collector is told

    def lost(handle):
        raise DeviceDown(15, "GPU is lost")

    with pytest.raises(DeviceDown):  # a lost GPU still takes the device down
        reader.ask("g", "ecc", lost, "h")
