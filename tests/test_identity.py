"""GPU identity end to end: keyed by UUID through re-enumeration, identity fields read one by
one (a device lost for metrics keeps its name), missing symbols and undecodable names never
take series away, and a lost driver is shut down before it is initialised again."""

from __future__ import annotations

import time
from typing import Any

from scenarios import GPU_IS_LOST, three_gpus

FUNCTION_NOT_FOUND = 13
BASE = three_gpus()
UUID = [BASE[f"gpu.{i}.uuid"] for i in range(3)]


def without_gpu(values: dict[str, Any], gone: int) -> dict[str, Any]:
    """The same machine after GPU `gone` fell off and NVML renumbered the rest."""
    out = {k: v for k, v in values.items() if not k.startswith("gpu.")}
    out["count"] = values["count"] - 1
    for key, value in values.items():
        if key.startswith("gpu."):
            _, index, rest = key.split(".", 2)
            i = int(index)
            if i != gone:
                out[f"gpu.{i if i < gone else i - 1}.{rest}"] = value
    return out


def test_renumbered_gpus_keep_their_uuid_and_the_missing_one_is_down(run_exporter, scenario):
    scenario.write(BASE)
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    scenario.write(without_gpu(BASE, 1))
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID[0]) == 1
    assert s.value("resmon_gpu_up", gpu="1", uuid=UUID[2]) == 1  # the L4, now index 1, healthy
    assert s.value("resmon_gpu_up", gpu="1", uuid=UUID[1]) == 0  # the lost A100, under its last index
    assert len(s.series("resmon_gpu_up")) == 3
    # the values follow the device, not the index
    assert s.value("resmon_gpu_memory_total_bytes", gpu="1", uuid=UUID[2]) == 24 * 1024**3
    assert not s.has("resmon_gpu_memory_total_bytes", uuid=UUID[1])
    assert s.value("resmon_gpu_info", gpu="1", uuid=UUID[2], name="NVIDIA L4") == 1
    assert s.value("resmon_gpu_info", gpu="1", uuid=UUID[1], name="NVIDIA A100-SXM4-40GB") == 1
    # it comes back at the end: up again, under its new index
    scenario.write({**BASE, **{f"gpu.2.{k.split('.', 2)[2]}": v for k, v in BASE.items() if k.startswith("gpu.1.")},
                    **{f"gpu.1.{k.split('.', 2)[2]}": v for k, v in BASE.items() if k.startswith("gpu.2.")}})
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="2", uuid=UUID[1]) == 1
    assert s.value("resmon_gpu_up", gpu="1", uuid=UUID[2]) == 1
    assert len(s.series("resmon_gpu_up")) == 3


def test_a_device_lost_at_start_keeps_the_identity_fields_that_answer(run_exporter, scenario):
    scenario.write({
        **BASE,
        # fallen off the bus but still enumerated: every metric call and max clocks fail,
        # the PCI info too; UUID and name still answer
        "gpu.1.rc.nvmlDeviceGetMemoryInfo_v2": GPU_IS_LOST,
        "gpu.1.rc.nvmlDeviceGetMaxClockInfo": GPU_IS_LOST,
        "gpu.1.rc.nvmlDeviceGetPciInfo_v3": GPU_IS_LOST,
    })
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="1", uuid=UUID[1]) == 0
    assert s.value("resmon_gpu_info", gpu="1", uuid=UUID[1], name="NVIDIA A100-SXM4-40GB", pci_bus_id="") == 1
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID[0]) == 1
    # the PCI info answers again: the identity fills in, the series keeps its uuid
    scenario.update(**{"gpu.1.rc.nvmlDeviceGetPciInfo_v3": None})
    s = exporter.scrape()
    assert s.value("resmon_gpu_info", gpu="1", uuid=UUID[1], pci_bus_id="00000000:0A:00.0") == 1
    assert len(s.series("resmon_gpu_info")) == 3


def test_missing_symbols_without_a_fallback_keep_every_series(run_exporter, scenario):
    scenario.write({
        **BASE,
        "rc.nvmlDeviceGetPciInfo_v3": FUNCTION_NOT_FOUND,
        "gpu.2.rc.nvmlDeviceGetUUID": FUNCTION_NOT_FOUND,
        "gpu.1.rc.nvmlDeviceGetHandleByIndex_v2": FUNCTION_NOT_FOUND,
    })
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    s = exporter.scrape()
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID[0]) == 1
    assert s.value("resmon_gpu_info", gpu="0", uuid=UUID[0], pci_bus_id="", name="NVIDIA H100 80GB HBM3") == 1
    assert s.value("resmon_gpu_up", gpu="1", uuid="") == 0  # no handle: down, not vanished
    assert s.value("resmon_gpu_up", gpu="2", uuid="") == 1  # no UUID: still up, still measured
    assert s.value("resmon_gpu_memory_total_bytes", gpu="2", uuid="") == 24 * 1024**3
    assert "Traceback" not in exporter.stderr and "GPU backend failed" not in exporter.stderr


def test_a_name_that_is_not_utf8_keeps_the_gpu_up(run_exporter, scenario):
    scenario.write(BASE)
    # written as bytes: a Latin-1 board name, as some VBIOSes have
    text = scenario.path.read_bytes().replace(b"name=NVIDIA L4", b"name=NVIDIA L4 \xe9dition")
    scenario.path.write_bytes(text)
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    for _ in range(2):
        s = exporter.scrape()
        assert s.value("resmon_gpu_up", gpu="2", uuid=UUID[2]) == 1
        assert s.value("resmon_gpu_info", gpu="2", uuid=UUID[2], name="NVIDIA L4 \ufffddition") == 1


def test_a_lost_driver_is_shut_down_before_it_is_initialised_again(run_exporter, scenario, trace):
    scenario.write(BASE)
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    scenario.update(**{"rc.nvmlDeviceGetCount_v2": 9})  # the module was unloaded
    assert {v for _, v in exporter.scrape().series("resmon_gpu_up")} == {0.0}
    scenario.update(**{"rc.nvmlDeviceGetCount_v2": None})
    exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert trace.count("nvmlInitWithFlags") == 2
    assert trace.count("nvmlShutdown") == 1  # before the second init, not only at exit
    assert exporter.stop() == 0
    assert trace.count("nvmlShutdown") == 2


def test_v1_memory_help_says_reserved_memory_is_included(run_exporter, scenario):
    scenario.write(BASE)
    exporter = run_exporter(lib="old")
    exporter.wait_ready()
    s = exporter.scrape()
    assert "driver-reserved memory included" in s.families["resmon_gpu_memory_used_bytes"].documentation
    assert not s.has("resmon_gpu_memory_reserved_bytes")
    current = run_exporter()
    current.wait_ready()
    assert "not included" in current.scrape().families["resmon_gpu_memory_used_bytes"].documentation


def test_a_transient_uuid_failure_keeps_the_gpu_and_leaves_no_phantom(run_exporter, scenario):
    scenario.write(BASE)
    exporter = run_exporter("--collect.cache-ttl=0")
    scenario.update(**{"gpu.2.rc.nvmlDeviceGetUUID": 999})  # UNKNOWN, once; the PCI info answers
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="2", uuid=UUID[2]) == 1  # recognised by its PCI bus id
    assert len(s.series("resmon_gpu_up")) == 3
    scenario.update(**{"gpu.2.rc.nvmlDeviceGetUUID": None})
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="2", uuid=UUID[2]) == 1 and len(s.series("resmon_gpu_up")) == 3
    assert "not answering" not in exporter.stderr


def test_without_uuids_a_renumbered_gpu_does_not_duplicate_a_series(run_exporter, scenario):
    machine = {**BASE, "rc.nvmlDeviceGetUUID": FUNCTION_NOT_FOUND}  # a driver without UUIDs: keyed by PCI bus id
    scenario.write(machine)
    exporter = run_exporter("--collect.cache-ttl=0")
    scenario.write(without_gpu(machine, 1))
    s = exporter.scrape()  # the parser would raise on a duplicate; count the label sets too
    labels = [tuple(sorted(l.items())) for l, _ in s.series("resmon_gpu_up")]
    assert len(labels) == len(set(labels)) == 2
    assert s.value("resmon_gpu_info", gpu="1", uuid="", pci_bus_id="00000000:0B:00.0") == 1


RESET_REQUIRED = 16


def test_max_clocks_that_failed_at_start_are_read_once_the_gpu_answers(run_exporter, scenario):
    # issue 22 item 4: RESET_REQUIRED on the first identity read (not NOT_SUPPORTED) leaves
    # the identity incomplete; the max clocks are asked again until they answer
    scenario.write({**BASE, "gpu.0.rc.nvmlDeviceGetMaxClockInfo": RESET_REQUIRED})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.scrape()
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID[0]) == 1
    assert not s.has("resmon_gpu_clock_max_hertz", gpu="0")
    assert s.value("resmon_gpu_clock_max_hertz", gpu="1", uuid=UUID[1], clock="sm") == 1410e6
    scenario.update(**{"gpu.0.rc.nvmlDeviceGetMaxClockInfo": None})
    s = exporter.wait_for(lambda s: s.has("resmon_gpu_clock_max_hertz", gpu="0"), timeout=10)
    for clock in ("graphics", "sm", "memory", "video"):
        assert s.value("resmon_gpu_clock_max_hertz", gpu="0", uuid=UUID[0], clock=clock) == BASE[f"gpu.0.max_clock.{clock}"] * 1e6


def test_max_clocks_not_supported_complete_the_identity(run_exporter, scenario, trace):
    # positively NOT_SUPPORTED: complete, not asked on every refresh
    scenario.write({**BASE, "gpu.2.rc.nvmlDeviceGetMaxClockInfo": 3})
    exporter = run_exporter("--collect.cache-ttl=0")
    for _ in range(3):
        s = exporter.scrape()
    assert not s.has("resmon_gpu_clock_max_hertz", gpu="2")
    assert trace.count("nvmlDeviceGetMaxClockInfo", device=2) == 4  # the first read's four clocks only


def _one_series_per_gpu(s: Any) -> list[tuple[str, str]]:
    ups = sorted((labels["gpu"], labels["uuid"]) for labels, _ in s.series("resmon_gpu_up"))
    infos = sorted((labels["gpu"], labels["uuid"]) for labels, _ in s.series("resmon_gpu_info"))
    assert ups == infos, (ups, infos)
    return ups


def test_a_gpu_whose_first_read_hangs_is_exported_once(run_exporter, scenario):
    # issue 22 item 6: the UUID answers, then the power call hangs past --collect.timeout
    scenario.write({**BASE, "gpu.0.delay_ms.nvmlDeviceGetPerformanceState": 2500})
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    expected = [("0", UUID[0]), ("1", UUID[1]), ("2", UUID[2])]
    for _ in range(3):
        s = exporter.scrape()
        assert _one_series_per_gpu(s) == expected
        assert s.value("resmon_gpu_up", gpu="0", uuid=UUID[0]) == 0
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetPerformanceState": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert _one_series_per_gpu(s) == expected
    assert s.value("resmon_gpu_info", gpu="0", uuid=UUID[0], name="NVIDIA H100 80GB HBM3") == 1


def test_a_gpu_whose_uuid_call_hangs_replaces_its_placeholder(run_exporter, scenario):
    # the identity itself hangs: one placeholder series (uuid="") until it is known, then
    # the UUID's, never both
    scenario.write({**BASE, "gpu.0.delay_ms.nvmlDeviceGetUUID": 2000})
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=1s")
    s = exporter.scrape()
    assert _one_series_per_gpu(s) in ([("0", ""), ("1", UUID[1]), ("2", UUID[2])], [("0", UUID[0]), ("1", UUID[1]), ("2", UUID[2])])
    seen_uuid = False
    until = time.monotonic() + 12
    while time.monotonic() < until and not seen_uuid:
        s = exporter.scrape()
        ups = _one_series_per_gpu(s)
        assert len(ups) == 3, ups
        seen_uuid = ("0", UUID[0]) in ups
    assert seen_uuid
    scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUUID": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert _one_series_per_gpu(s) == [("0", UUID[0]), ("1", UUID[1]), ("2", UUID[2])]


def test_a_gpu_the_refresh_never_started_is_not_called_in_flight(fake_libs, tmp_path_factory, tmp_path, monkeypatch, log):
    # issue 22 item 11c: a deadline so short that the relay starts GPU 0 only: GPUs 1 and 2
    # were never started, which is what the log must say (not "in flight")
    import logging

    from resmon_exporter.backends.nvml.backend import NvmlBackend
    from fakenvml import Scenario, load_in_process

    load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    scenario = Scenario(tmp_path / "scenario.txt", {**BASE, "gpu.0.delay_ms.nvmlDeviceGetUUID": 1500})
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    logger, records = log
    backend = NvmlBackend(logger, explicit=True, device_timeout=0.001)
    try:
        reading = backend.read()
        assert not reading.success and [d.up for d in reading.devices] == [False] * 3
        by_gpu = {r.resmon_fields["gpu"]: r.getMessage() for r in records.records
                  if r.levelno == logging.WARNING and r.getMessage().startswith("GPU read")}
        assert "in flight" in by_gpu[0], by_gpu
        for i in (1, 2):
            assert "not started" in by_gpu[i] and "in flight" not in by_gpu[i], by_gpu
    finally:
        scenario.update(**{"gpu.0.delay_ms.nvmlDeviceGetUUID": None})
        until = time.monotonic() + 10
        while backend._workers[0].busy and time.monotonic() < until:  # the hung call returns: no shutdown left pending
            time.sleep(0.02)
        backend.close()
