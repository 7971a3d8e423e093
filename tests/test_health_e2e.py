"""The v2 GPU collectors (gpu additions, health, nvlink) end to end: the real CLI on the fake
NVML, one machine with a Hopper (HBM, ECC, row remapping, NVLink, every field id), a Volta
on an older driver (page retirement, the violation-status fallback) and a GeForce (none of
the datacenter values: absent, never 0)."""

from __future__ import annotations

import subprocess
import time

import pytest

import scenarios as sc
from fakenvml import Scrape
from scenarios import NOT_SUPPORTED, board_uuid, health_machine

HEALTH = {
    "resmon_gpu_ecc_enabled", "resmon_gpu_ecc_errors", "resmon_gpu_retired_pages", "resmon_gpu_retired_pages_pending",
    "resmon_gpu_remapped_rows", "resmon_gpu_row_remap_pending", "resmon_gpu_row_remap_failed", "resmon_gpu_recovery_action",
}
XID = {"resmon_gpu_xid_errors", "resmon_gpu_xid_last_timestamp_seconds"}
NVLINK = {"resmon_gpu_nvlink_active", "resmon_gpu_nvlink_bytes", "resmon_gpu_nvlink_errors"}
GPU = {"gpu": "0", "uuid": board_uuid("hopper", 0)}
VOLTA = {"gpu": "1", "uuid": board_uuid("volta", 1)}
GEFORCE = {"gpu": "2", "uuid": board_uuid("consumer", 2)}
REASON_FIELDS = {reason: fid for reason, (fid, _) in sc.CLOCK_EVENT_FIELDS.items()}


def per_gpu(s: Scrape, name: str, gpu: dict[str, str]) -> list[tuple[dict[str, str], float]]:
    return s.series(name, **gpu)


@pytest.fixture
def machine(scenario):
    scenario.write(health_machine())
    return scenario


def test_hopper_every_value(run_exporter, machine):
    s = run_exporter().scrape()
    assert s.value("resmon_gpu_memory_temperature_celsius", **GPU) == sc.HOPPER_MEMORY_TEMP
    assert s.value("resmon_gpu_encoder_utilization_ratio", **GPU) == pytest.approx(sc.HOPPER_ENCODER_UTIL / 100)
    assert s.value("resmon_gpu_decoder_utilization_ratio", **GPU) == pytest.approx(sc.HOPPER_DECODER_UTIL / 100)
    for reason, fid in REASON_FIELDS.items():
        assert s.value("resmon_gpu_clock_event_seconds_total", reason=reason, **GPU) == pytest.approx(
            sc.HOPPER_CLOCK_EVENT_NS[fid] / 1e9), reason
    assert s.value("resmon_gpu_pcie_link_generation", bound="current", **GPU) == sc.HOPPER_PCIE["gen"]
    assert s.value("resmon_gpu_pcie_link_generation", bound="max", **GPU) == sc.HOPPER_PCIE["gen_max"]
    assert s.value("resmon_gpu_pcie_link_width_lanes", bound="current", **GPU) == sc.HOPPER_PCIE["width"]
    assert s.value("resmon_gpu_pcie_link_width_lanes", bound="max", **GPU) == sc.HOPPER_PCIE["width_max"]
    assert s.value("resmon_gpu_pcie_replays_total", **GPU) == sc.HOPPER_PCIE["replays"]
    assert s.value("resmon_gpu_pcie_bytes_total", direction="transmit", **GPU) == sc.HOPPER_PCIE_TX_BYTES
    assert s.value("resmon_gpu_pcie_bytes_total", direction="receive", **GPU) == sc.HOPPER_PCIE_RX_BYTES
    assert {l["engine"] for l, _ in per_gpu(s, "resmon_gpu_busy_seconds_total", GPU)} == {"gpu", "memory", "encoder", "decoder"}
    # health
    assert s.value("resmon_gpu_ecc_enabled", mode="current", **GPU) == 1
    assert s.value("resmon_gpu_ecc_enabled", mode="pending", **GPU) == 1
    for key, count in sc.HOPPER_ECC.items():
        kind, scope = key.split(".")
        assert s.value("resmon_gpu_ecc_errors_total", type=kind, scope=scope, **GPU) == count, key
    assert s.value("resmon_gpu_remapped_rows", cause="correctable", **GPU) == sc.HOPPER_REMAPPED["correctable"]
    assert s.value("resmon_gpu_remapped_rows", cause="uncorrectable", **GPU) == sc.HOPPER_REMAPPED["uncorrectable"]
    assert s.value("resmon_gpu_row_remap_pending", **GPU) == 0
    assert s.value("resmon_gpu_row_remap_failed", **GPU) == 0
    assert s.value("resmon_gpu_recovery_action", **GPU) == sc.HOPPER_RECOVERY_ACTION
    assert not per_gpu(s, "resmon_gpu_retired_pages", GPU)  # row-remapping part: no page retirement
    assert not per_gpu(s, "resmon_gpu_retired_pages_pending", GPU)
    # nvlink: every link, bytes in KiB x 1024, the four contract error types
    assert len(per_gpu(s, "resmon_gpu_nvlink_active", GPU)) == sc.HOPPER_NVLINKS
    for link in range(sc.HOPPER_NVLINKS):
        labels = {**GPU, "link": str(link)}
        assert s.value("resmon_gpu_nvlink_active", **labels) == 1
        assert s.value("resmon_gpu_nvlink_bytes_total", direction="transmit", **labels) == sc.HOPPER_NVLINK_TX_KIB[link] * 1024
        assert s.value("resmon_gpu_nvlink_bytes_total", direction="receive", **labels) == sc.HOPPER_NVLINK_RX_KIB[link] * 1024
        for kind in ("replay", "recovery", "crc_flit", "crc_data"):
            assert s.value("resmon_gpu_nvlink_errors_total", type=kind, **labels) == sc.HOPPER_NVLINK_ERRORS.get((link, kind), 0)
    assert not s.series("resmon_gpu_nvlink_errors_total", type="ecc_data")  # not in the contract
    for collector in ("health", "nvlink"):
        assert s.value("resmon_collector_success", collector=collector) == 1
        assert s.has("resmon_collector_duration_seconds", collector=collector)
        # served from the slow read (issue 24): as old as that read, never newer than the refresh
        gpu_stamp = s.value("resmon_last_refresh_timestamp_seconds", collector="gpu")
        assert gpu_stamp - 60 < s.value("resmon_last_refresh_timestamp_seconds", collector=collector) <= gpu_stamp


def test_encoder_and_decoder_gauges_take_the_sample_buffers_newest_sample_while_it_is_current(run_exporter, scenario, trace):
    # the driver's rate is its newest sample; this board's calls answer other values, so the
    # test tells the two sources apart
    scenario.write({**health_machine(), "gpu.0.encoder_util": 70, "gpu.0.samples.encoder": "20",
                    "gpu.0.decoder_util": 60, "gpu.0.samples.decoder": "30"})
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.scrape()  # past the first read (the whole ring, whose newest may be old: the calls)
    trace.clear()
    for _ in range(5):
        s = exporter.scrape()
        assert s.value("resmon_gpu_encoder_utilization_ratio", **GPU) == pytest.approx(0.2)
        assert s.value("resmon_gpu_decoder_utilization_ratio", **GPU) == pytest.approx(0.3)
    assert trace.count("nvmlDeviceGetEncoderUtilization", 0) == 0 and trace.count("nvmlDeviceGetDecoderUtilization", 0) == 0
    assert trace.count("nvmlDeviceGetSamples", 0) >= 5 * 4
    # the encoder's buffer runs dry (an idle engine): its gauge is the call's again, the decoder's stays
    scenario.update(**{"gpu.0.samples.rc.encoder": sc.NOT_FOUND})
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_encoder_utilization_ratio", **GPU) == pytest.approx(0.7))
    assert s.value("resmon_gpu_decoder_utilization_ratio", **GPU) == pytest.approx(0.3)
    assert trace.count("nvmlDeviceGetEncoderUtilization", 0) >= 1

def test_the_temperature_comes_from_the_field_batch_with_its_sub_degree_else_from_the_call(run_exporter, scenario, trace):
    scenario.write({**health_machine(), "gpu.0.temperature": 54, "gpu.0.field_double.308": 54.25})
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.scrape()
    trace.clear()
    s = exporter.scrape()
    assert s.value("resmon_gpu_temperature_celsius", **GPU) == 54.25
    assert trace.count("nvmlDeviceGetTemperatureV", 0) == 0 and trace.count("nvmlDeviceGetTemperature", 0) == 0
    # a driver without field 308 (its entry NOT_SUPPORTED): the call, whole degrees
    scenario.update(**{"gpu.0.field_rc.308": NOT_SUPPORTED})
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_temperature_celsius", **GPU) == 54)
    assert trace.count("nvmlDeviceGetTemperatureV", 0) >= 1


def test_volta_on_an_older_driver(run_exporter, machine):
    s = run_exporter().scrape()
    assert s.value("resmon_gpu_memory_temperature_celsius", **VOLTA) == sc.VOLTA_MEMORY_TEMP
    assert s.value("resmon_gpu_retired_pages", cause="multiple_single_bit", **VOLTA) == sc.VOLTA_RETIRED["multiple_single_bit"]
    assert s.value("resmon_gpu_retired_pages", cause="double_bit", **VOLTA) == sc.VOLTA_RETIRED["double_bit"]
    assert s.value("resmon_gpu_retired_pages_pending", **VOLTA) == sc.VOLTA_RETIRED["pending"]
    for name in ("resmon_gpu_remapped_rows", "resmon_gpu_row_remap_pending", "resmon_gpu_row_remap_failed",
                 "resmon_gpu_recovery_action", "resmon_gpu_pcie_bytes_total"):
        assert not per_gpu(s, name, VOLTA), name  # Ampere+ / newer-driver values
    # no clock-event field ids on this driver: the violation-status fallback, where a policy exists
    for reason, (_, policy) in sc.CLOCK_EVENT_FIELDS.items():
        if policy is None:
            assert not s.series("resmon_gpu_clock_event_seconds_total", reason=reason, **VOLTA), reason
        else:
            assert s.value("resmon_gpu_clock_event_seconds_total", reason=reason, **VOLTA) == pytest.approx(
                sc.VOLTA_VIOLATION_NS[policy] / 1e9), reason
    assert len(per_gpu(s, "resmon_gpu_nvlink_active", VOLTA)) == sc.VOLTA_NVLINKS
    assert s.value("resmon_gpu_nvlink_errors_total", link="2", type="replay", **VOLTA) == 1


def test_geforce_has_none_of_the_datacenter_values(run_exporter, machine):
    s = run_exporter().scrape()
    for name in ("resmon_gpu_memory_temperature_celsius", "resmon_gpu_ecc_enabled", "resmon_gpu_ecc_errors_total",
                 "resmon_gpu_retired_pages", "resmon_gpu_retired_pages_pending", "resmon_gpu_remapped_rows",
                 "resmon_gpu_row_remap_pending", "resmon_gpu_row_remap_failed", "resmon_gpu_recovery_action",
                 "resmon_gpu_nvlink_active", "resmon_gpu_nvlink_bytes_total", "resmon_gpu_nvlink_errors_total",
                 "resmon_gpu_pcie_bytes_total", "resmon_gpu_xid_errors_total"):
        assert not per_gpu(s, name, GEFORCE), name
    # what GeForce does answer is there, zeros included
    for reason, fid in REASON_FIELDS.items():
        assert s.value("resmon_gpu_clock_event_seconds_total", reason=reason, **GEFORCE) == sc.CONSUMER_CLOCK_EVENT_NS[fid] / 1e9
    assert s.value("resmon_gpu_pcie_link_width_lanes", bound="current", **GEFORCE) == sc.CONSUMER_PCIE["width"]
    assert s.value("resmon_gpu_pcie_link_width_lanes", bound="max", **GEFORCE) == sc.CONSUMER_PCIE["width_max"]


def test_consumer_only_host_has_no_nvlink_or_xid_collector(run_exporter, scenario):
    scenario.write({"count": 1, **sc.consumer_board(0)})
    exporter = run_exporter()
    s = exporter.wait_for(lambda s: s.has("resmon_collector_success", collector="health"))
    time.sleep(1.5)  # the XID watcher has tried (and skipped) the GPU by now
    s = exporter.scrape()
    assert s.value("resmon_collector_success", collector="health") == 1
    for collector in ("nvlink", "xid"):  # inactive: nothing to read here
        for family in ("resmon_collector_success", "resmon_collector_duration_seconds", "resmon_last_refresh_timestamp_seconds"):
            assert not s.has(family, collector=collector), (collector, family)
    served = [name for name in s.samples if s.samples[name]]
    assert not [n for n in served if n.startswith(tuple(HEALTH | NVLINK | XID))]


@pytest.mark.parametrize("collector,families", [("health", HEALTH), ("xid", XID), ("nvlink", NVLINK)])
def test_no_collector_flag_removes_exactly_its_families(run_exporter, machine, scenario, collector, families):
    # families with no series yet (no XID so far) are still declared (HELP and TYPE)
    on = run_exporter()
    off = run_exporter(f"--no-collector.{collector}")
    time.sleep(1.5)  # the XID watcher has registered
    with_all, without = on.scrape(), off.scrape()
    assert set(with_all.families) - set(without.families) == families
    assert set(without.families) <= set(with_all.families)
    assert not without.has("resmon_collector_success", collector=collector)
    assert with_all.has("resmon_collector_success", collector=collector)
    others = {c for c in ("gpu", "health", "xid", "nvlink", "host") if c != collector}
    assert {l["collector"] for l, _ in without.series("resmon_collector_success")} == others


def test_busy_seconds_rate_is_the_true_mean_across_buffer_overflows(run_exporter, scenario):
    # one sample every 20 ms, 50 kept: a 1 s buffer; scrapes 2.5 s apart overflow it every
    # time (gaps filled at the mean of what follows), scrapes 0.3 s apart never do
    scenario.write({"count": 1, **sc.hopper_board(0)})
    exporter = run_exporter("--collect.cache-ttl=0")
    labels = {"gpu": "0", "uuid": board_uuid("hopper", 0)}

    def point() -> tuple[float, dict[str, float]]:
        s = exporter.scrape()
        stamp = s.value("resmon_last_refresh_timestamp_seconds", collector="gpu")
        return stamp, {e: s.value("resmon_gpu_busy_seconds_total", engine=e, **labels) for e in ("gpu", "memory")}

    for interval, count in ((2.5, 5), (0.3, 30)):
        t0, b0 = point()
        for _ in range(count):
            time.sleep(interval)
        t1, b1 = point()
        elapsed = t1 - t0
        assert elapsed > 5
        for engine, pattern in (("gpu", sc.HOPPER_SAMPLES_GPU), ("memory", sc.HOPPER_SAMPLES_MEMORY)):
            expected = sum(pattern) / len(pattern) / 100
            assert (b1[engine] - b0[engine]) / elapsed == pytest.approx(expected, rel=0.05), (interval, engine)


def test_memory_temperature_entry_checks(run_exporter, scenario):
    base = {"count": 1, **sc.hopper_board(0)}
    scenario.write({**base, "gpu.0.field_type.82": 0})  # r545: a uint labelled DOUBLE
    exporter = run_exporter("--collect.cache-ttl=0")
    assert exporter.scrape().value("resmon_gpu_memory_temperature_celsius", **GPU) == sc.HOPPER_MEMORY_TEMP
    for bad in ({"gpu.0.field_double.82": 1.0e6}, {"gpu.0.field_rc.82": NOT_SUPPORTED}, {"gpu.0.field.82": 0}):
        scenario.write({**base, **bad})
        exporter.wait_for(lambda s: not s.has("resmon_gpu_memory_temperature_celsius"))
        assert exporter.scrape().value("resmon_gpu_up", **GPU) == 1
    scenario.write({**base, "gpu.0.field_double.82": 61.5})  # a real double
    exporter.wait_for(lambda s: s.series("resmon_gpu_memory_temperature_celsius", **GPU) == [(GPU, 61.5)])


def test_one_field_value_batch_per_device_per_refresh(run_exporter, machine, trace):
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.scrape()
    trace.clear()
    refreshes = 5
    for _ in range(refreshes):
        exporter.scrape()
    time.sleep(0.2)
    for device in range(3):
        assert trace.count("nvmlDeviceGetFieldValues", device) == refreshes, device
    # a board that answered NOT_SUPPORTED is not asked again: no retired pages on the H100
    assert trace.count("nvmlDeviceGetRetiredPages", 0) == 0
    assert trace.count("nvmlDeviceGetRemappedRows", 1) == 0
    assert trace.count("nvmlDeviceGetPcieThroughput") == 0  # the 20 ms blocking call: never


def test_health_of_a_lost_gpu_goes_away_the_others_stay(run_exporter, machine, scenario):
    exporter = run_exporter("--collect.cache-ttl=0")
    scenario.update(**{"gpu.0.rc.all": 15})
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_up", **GPU) == 0)
    assert not per_gpu(s, "resmon_gpu_ecc_errors_total", GPU)
    assert not per_gpu(s, "resmon_gpu_nvlink_active", GPU)
    assert per_gpu(s, "resmon_gpu_retired_pages", VOLTA)
    assert s.value("resmon_collector_success", collector="health") == 1
    scenario.update(**{"gpu.0.rc.all": None})
    s = exporter.wait_for(lambda s: s.value("resmon_gpu_up", **GPU) == 1)
    assert s.value("resmon_gpu_remapped_rows", cause="correctable", **GPU) == sc.HOPPER_REMAPPED["correctable"]


def test_a_failed_gpu_read_fails_health_and_nvlink_too(run_exporter, machine, scenario):
    exporter = run_exporter("--collect.cache-ttl=0", "--gpu.backend=nvml")
    scenario.update(**{"rc.nvmlDeviceGetCount_v2": 999})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 0)
    assert s.value("resmon_collector_success", collector="health") == 0
    assert s.value("resmon_collector_success", collector="nvlink") == 0


def test_promtool_check_metrics_is_clean(run_exporter, machine):
    from test_stack import need

    exporter = run_exporter()
    exporter.scrape()
    text = exporter.scrape().text
    result = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stdout + result.stderr


def test_an_odd_answer_to_a_health_query_drops_that_value_not_the_gpu(run_exporter, machine, scenario):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.slow-interval=0")  # slow values too, every refresh
    odd = {"gpu.0.rc.nvmlDeviceGetPcieReplayCounter": 999, "gpu.0.rc.nvmlDeviceGetNvLinkErrorCounter": 2,
           "gpu.0.rc.nvmlDeviceGetSamples": 999, "gpu.0.rc.nvmlDeviceGetRemappedRows": 10}
    scenario.update(**odd)
    s = exporter.wait_for(lambda s: not s.has("resmon_gpu_pcie_replays_total", **GPU))
    assert s.value("resmon_gpu_up", **GPU) == 1
    for name in ("resmon_gpu_nvlink_errors_total", "resmon_gpu_remapped_rows"):
        assert not per_gpu(s, name, GPU), name
    assert per_gpu(s, "resmon_gpu_nvlink_active", GPU) and per_gpu(s, "resmon_gpu_ecc_errors_total", GPU)
    assert s.value("resmon_gpu_memory_used_bytes", **GPU) >= 0
    # the values are missing, so the collectors say so (their alerts are blind meanwhile)
    assert s.value("resmon_collector_success", collector="health") == 0
    assert s.value("resmon_collector_success", collector="nvlink") == 0
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert "GPU query failed" in exporter.stderr
    # answers again at once: a one-off failure is not remembered as "not supported"
    scenario.update(**dict.fromkeys(odd))
    s = exporter.wait_for(lambda s: s.has("resmon_gpu_pcie_replays_total", **GPU))
    assert s.value("resmon_gpu_remapped_rows", cause="correctable", **GPU) == sc.HOPPER_REMAPPED["correctable"]
    assert s.value("resmon_collector_success", collector="health") == 1
    # a lost GPU is still a lost GPU, whichever call says so
    scenario.update(**{"gpu.0.rc.nvmlDeviceGetEccMode": 15})
    exporter.wait_for(lambda s: s.value("resmon_gpu_up", **GPU) == 0)
