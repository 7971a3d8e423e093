"""The dashboards' allocation panels with DRA rows (issue 38): evaluated by Prometheus's own
engine (promtool test rules, as tests/test_stack.py does for device-plugin rows), and served by
a real Prometheus scraping the exporter, which reads a fake kubelet's dynamic_resources. The
two new labels, claim and share, ride along on every row and break no join."""

from __future__ import annotations

from pathlib import Path

import yaml
from fake_kubelet import Claim, Container, Device, DraDevice, Pod
from fakenvml import GIB
from promstack import PromApi, need, start_listening, stop_all, wait_until
from scenarios import board_uuid
from test_stack import panel_exprs, promtool_instant


def test_allocation_panels_with_dra_rows(tmp_path: Path) -> None:
    """Pod a holds GPU 0 through a claim; pods b and c share GPU 1 through one device with two
    share ids; pod d, on a node in transition, holds GPU 1 through the device plugin too."""
    node = panel_exprs("resmon-node.json", "GPU allocations by pod")
    fleet = panel_exprs("resmon-fleet.json", "Pods by VRAM")
    host = {"job": "resmon", "instance": "h:9636"}
    gpus = {"0": {**host, "gpu": "0", "uuid": "GPU-0"}, "1": {**host, "gpu": "1", "uuid": "GPU-1"}}

    def row(gpu: str, pod: str, resource: str, device: str, claim: str = "", share: str = "") -> dict[str, str]:
        labels = {**gpus[gpu], "namespace": "ml", "pod": pod, "container": "main", "resource": resource,
                  "device_id": device, "claim": claim, "share": share}
        return {k: v for k, v in labels.items() if v}  # an empty label is no label to Prometheus

    allocations = [row("0", "a", "gpu.nvidia.com", "gpu-2", "train"),
                   row("1", "b", "gpu.nvidia.com", "gpu-0", "infer-b", "5c1d7e0a"),
                   row("1", "c", "gpu.nvidia.com", "gpu-0", "infer-c", "9e4f2b11"),
                   row("1", "d", "nvidia.com/gpu", "GPU-1")]
    owner = {"namespace": "ml", "container": "main"}
    procs = [({**gpus["0"], "pid": "1", "pod": "a", **owner}, 30 * GIB, 0.5),
             ({**gpus["1"], "pid": "2", "pod": "b", **owner}, 4 * GIB, 0.25),
             ({**gpus["1"], "pid": "3", "pod": "c", **owner}, 6 * GIB, 0.125)]
    series = [("resmon_gpu_memory_used_bytes", gpus["0"], 31 * GIB),
              ("resmon_gpu_memory_used_bytes", gpus["1"], 10 * GIB)]
    series += [("resmon_gpu_allocation_info", a, 1) for a in allocations]
    series += [("resmon_gpu_process_memory_used_bytes", labels, vram) for labels, vram, _ in procs]
    series += [("resmon_gpu_process_utilization_ratio", {**labels, "engine": engine}, sm if engine == "sm" else 1)
               for labels, _, sm in procs for engine in ("sm", "memory")]
    a, b, c, d = allocations

    def pod(name: str) -> dict[str, str]:
        return {"instance": "h:9636", "namespace": "ml", "pod": name}

    promtool_instant(tmp_path, series, [
        (node["A"], [({"__name__": "resmon_gpu_allocation_info", **x}, 1) for x in allocations]),
        (node["B"], [(a, 30 * GIB), (b, 4 * GIB), (c, 6 * GIB)]),  # each share's pod: its own processes
        (node["C"], [(a, 31 * GIB), (b, 10 * GIB), (c, 10 * GIB), (d, 10 * GIB)]),  # the device's
        (fleet["A"], [(pod("a"), 30 * GIB), (pod("b"), 4 * GIB), (pod("c"), 6 * GIB)]),
        (fleet["B"], [(pod("a"), 0.5), (pod("b"), 0.25), (pod("c"), 0.125)]),
        (fleet["C"], [(pod("a"), 1), (pod("b"), 1), (pod("c"), 1), (pod("d"), 1)]),
    ])


def test_a_real_prometheus_serves_the_allocation_panels_with_dra_rows(run_exporter, scenario, kubelet, tmp_path):
    """The exporter on the fake NVML (minors unlike indices) and a fake 1.34 kubelet, scraped by
    Prometheus: the node panel's allocation and device-VRAM queries and the fleet panel's GPU
    count return the DRA rows, with claim and share, beside a device plugin's row."""
    g0, g1 = board_uuid("hopper", 0), board_uuid("hopper", 1)
    scenario.write({"count": 2, "gpu.0.uuid": g0, "gpu.1.uuid": g1, "gpu.0.minor": 1, "gpu.1.minor": 0,
                    "gpu.0.memory_used": 7 * GIB, "gpu.1.memory_used": 3 * GIB})
    kubelet.pods = [
        Pod("ml", "a", [Container("main", [], claims=[Claim("train", [DraDevice("gpu.nvidia.com", "gpu-1")])])]),
        Pod("ml", "b", [Container("main", [], claims=[Claim("infer-b", [DraDevice("gpu.nvidia.com", "gpu-0", share_id="s-b")])])]),
        Pod("ml", "c", [Container("main", [], claims=[Claim("infer-c", [DraDevice("gpu.nvidia.com", "gpu-0", share_id="s-c")])])]),
        Pod("ml", "d", [Container("main", [Device("nvidia.com/gpu", [g1])])]),
    ]
    kubelet.start()
    exporter = run_exporter(f"--kubernetes.pod-resources-socket={kubelet.socket_path}")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "resmon", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}],
    }))
    proc, port = start_listening([need("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'tsdb'}"], tmp_path / "prometheus.log")
    try:
        prom = PromApi(port)
        node = panel_exprs("resmon-node.json", "GPU allocations by pod")
        fleet = panel_exprs("resmon-fleet.json", "Pods by VRAM")

        def rows(expr: str) -> set[tuple[str, ...]]:
            return {(m["pod"], m.get("gpu", ""), m.get("resource", ""), m.get("device_id", ""), m.get("claim", ""),
                     m.get("share", ""), r["value"][1]) for r in prom.query(expr) for m in [r["metric"]]}

        want = {("a", "0", "gpu.nvidia.com", "gpu-1", "train", ""), ("b", "1", "gpu.nvidia.com", "gpu-0", "infer-b", "s-b"),
                ("c", "1", "gpu.nvidia.com", "gpu-0", "infer-c", "s-c"), ("d", "1", "nvidia.com/gpu", g1, "", "")}
        wait_until("the DRA rows in Prometheus", lambda: {r[:6] for r in rows(node["A"])} == want, 60)
        device_vram = {r[0]: float(r[6]) for r in rows(node["C"])}
        assert device_vram == {"a": 7 * GIB, "b": 3 * GIB, "c": 3 * GIB, "d": 3 * GIB}
        assert {r[0]: r[6] for r in rows(fleet["C"])} == {"a": "1", "b": "1", "c": "1", "d": "1"}
    finally:
        stop_all([proc])
