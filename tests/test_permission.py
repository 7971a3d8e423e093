"""A GPU the exporter may not open (NVML_ERROR_NO_PERMISSION, issue 22 item 12) is a failure,
never "no GPU": a container without the device nodes, a user outside the `video` group.

NO_PERMISSION where the exporter cannot do without the answer (nvmlInit, the device count, a
device's handle) fails the gpu collector and says why (resmon_collector_error_info, a log
line repeated with backoff); NO_PERMISSION on one value of an opened GPU (some clocks or ECC
calls refuse non-root) leaves just that value out."""

from __future__ import annotations

from scenarios import three_gpus

NO_PERMISSION = 4
UUID0 = "GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000000"
UUID1 = "GPU-0c1c7b8e-1d2e-4c47-9b5a-000000000001"
ERROR_INFO = "resmon_collector_error_info"


def denied(s) -> bool:
    return (s.has("resmon_collector_success", collector="gpu")
            and s.value("resmon_collector_success", collector="gpu") == 0
            and s.has(ERROR_INFO, collector="gpu", reason="no_permission"))


def test_init_without_permission_is_a_failure_then_recovers(run_exporter, scenario):
    scenario.write({**three_gpus(), "init": NO_PERMISSION})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.wait_for(denied, timeout=10)
    assert s.value("resmon_collector_success", collector="gpu") == 0
    assert s.value(ERROR_INFO, collector="gpu", reason="no_permission") == 1
    assert s.value("resmon_gpu_backend_info", backend="nvml") == 1  # not "none": NVML is there and refuses us
    assert s.value("resmon_collector_success", collector="host") == 1
    # ready: the exporter serves, and the failure is in the scrape (a 503 would hide the target)
    assert exporter.request("/-/ready")[0] == 200
    # the reason, with the fix, in the log, and not only once: again with backoff (1 s, 2 s, ...)
    exporter.wait_for(lambda s: exporter.stderr.count("NVML refuses this process") >= 2, timeout=15)
    line = next(l for l in exporter.stderr_lines if "NVML refuses this process" in l)
    assert "level=warn" in line.lower() and "/dev/nvidia" in line, line

    scenario.update(init=0)  # the device nodes are given (a restart of the pod, a group change)
    s = exporter.wait_for(lambda s: s.has("resmon_gpu_up", uuid=UUID0) and s.value("resmon_gpu_up", uuid=UUID0) == 1, timeout=40)
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert s.value("resmon_gpu_devices") == 3
    assert not s.has(ERROR_INFO)


def test_device_count_without_permission_is_a_failure(run_exporter, scenario):
    scenario.write({**three_gpus(), "rc.nvmlDeviceGetCount_v2": NO_PERMISSION})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.wait_for(denied, timeout=10)
    assert s.value("resmon_gpu_backend_info", backend="nvml") == 1
    assert exporter.request("/-/ready")[0] == 200


def test_handle_lookup_without_permission_is_a_failure(run_exporter, scenario):
    scenario.write({**three_gpus(), "rc.nvmlDeviceGetHandleByIndex_v2": NO_PERMISSION})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.wait_for(denied, timeout=10)
    assert s.value("resmon_gpu_devices") == 3  # enumerated, but none may be opened
    assert {v for _, v in s.series("resmon_gpu_up")} == {0.0}
    assert exporter.request("/-/ready")[0] == 200
    exporter.wait_for(lambda s: "NVML refuses this process" in exporter.stderr, timeout=5)

    scenario.update(**{"rc.nvmlDeviceGetHandleByIndex_v2": None})
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="gpu") == 1, timeout=20)
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID0) == 1
    assert not s.has(ERROR_INFO)


def test_one_gpu_without_permission_fails_the_collector_not_the_others(run_exporter, scenario):
    scenario.write({**three_gpus(), "gpu.1.rc.nvmlDeviceGetHandleByIndex_v2": NO_PERMISSION})
    exporter = run_exporter("--collect.cache-ttl=0")
    s = exporter.wait_for(denied, timeout=10)
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID0) == 1
    assert s.value("resmon_gpu_memory_total_bytes", gpu="0", uuid=UUID0) > 0
    assert [v for _, v in s.series("resmon_gpu_up", gpu="1")] == [0.0]


def test_one_value_without_permission_is_just_absent(run_exporter, scenario):
    # some calls answer NO_PERMISSION to non-root on an opened GPU: that value is absent, nothing fails
    scenario.write({**three_gpus(), "gpu.0.rc.nvmlDeviceGetPowerUsage": NO_PERMISSION})
    s = run_exporter("--collect.cache-ttl=0").scrape()
    assert s.value("resmon_collector_success", collector="gpu") == 1
    assert s.value("resmon_gpu_up", gpu="0", uuid=UUID0) == 1
    assert not s.has("resmon_gpu_power_watts", uuid=UUID0)
    assert s.has("resmon_gpu_power_watts", uuid=UUID1)
    assert not s.has(ERROR_INFO)
