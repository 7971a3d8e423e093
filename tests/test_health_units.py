"""The two pieces of arithmetic under the health families, on their own: field-value decoding
(per-entry status, value types, the mislabelled double, sentinels) and busy-time
integration (each sample once, the gap rule, a restarted driver clock)."""

from __future__ import annotations

import struct

import pynvml
import pytest

from exporter.backends.nvml_busy import BusyIntegrator
from exporter.backends.nvml_fields import decode, in_range


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


def test_each_sample_counts_once_for_the_interval_before_it():
    busy = BusyIntegrator()
    first = series(1_000_000, 100_000, [50.0] * 10)  # 0.9 s of spacing inside the batch
    assert busy.add("g", "gpu", first) == pytest.approx(0.45)
    assert busy.last_seen("g", "gpu") == first[-1][0]
    # the same samples again (a driver ignoring lastSeen) add nothing
    assert busy.add("g", "gpu", first) == pytest.approx(0.45)
    nxt = series(first[-1][0] + 100_000, 100_000, [100.0] * 5)  # 0.5 s at 100 %
    assert busy.add("g", "gpu", nxt) == pytest.approx(0.95)
    assert busy.add("g", "gpu", []) == pytest.approx(0.95)  # nothing newer: unchanged


def test_a_gap_longer_than_the_buffer_is_filled_at_the_mean_of_what_follows():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(0, 100_000, [0.0, 0.0]))
    # 10 s later the buffer holds only its last 1 s: alternating 100/0, mean 50 %
    later = series(10_100_000, 100_000, [100.0, 0.0] * 5)
    total = busy.add("g", "gpu", later)
    gap_s = (later[0][0] - 100_000) / 1e6
    inside_s = sum(v / 100 * 0.1 for _, v in later[1:])
    assert total == pytest.approx(gap_s * 0.5 + inside_s)
    assert total / (later[-1][0] / 1e6 - 0.1) == pytest.approx(0.5, rel=0.02)


def test_a_restarted_driver_clock_starts_over_without_going_back():
    busy = BusyIntegrator()
    busy.add("g", "gpu", series(50_000_000, 100_000, [100.0] * 3))
    before = busy.total("g", "gpu")
    busy.reset()
    assert busy.last_seen("g", "gpu") == 0  # ask for the whole new buffer
    after = busy.add("g", "gpu", series(1_000, 100_000, [100.0] * 3))
    assert after == pytest.approx(before + 0.2)
    assert busy.total("g", "other") is None


def test_values_outside_0_to_100_are_clamped():
    busy = BusyIntegrator()
    assert busy.add("g", "gpu", series(0, 1_000_000, [250.0, 250.0])) == pytest.approx(1.0)
    assert busy.add("h", "gpu", series(0, 1_000_000, [-5.0, -5.0])) == 0.0
