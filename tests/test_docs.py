"""docs/metrics.md, the collector and a real scrape must agree; README and CI too."""

from __future__ import annotations

import os
import re
import shutil

from exporter.collector import FAMILIES
from fake_kubelet import Container, Device, FakeKubelet, Pod, short_socket_dir
from fakenvml import GIB, REPO
from scenarios import board_uuid, health_machine, profiling_machine

DOC = REPO / "docs" / "metrics.md"
SPEC = REPO.parent / "shared" / "spec" / "metrics.md"
SPEC_COPY = REPO / "tests" / "data" / "metrics-contract.md"


def doc_rows() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`resmon_"):
            labels = set(re.findall(r"`([a-z_]+)`", cells[2]))
            rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def test_docs_list_exactly_the_collectors_families():
    rows = doc_rows()
    assert set(rows) == set(FAMILIES)
    for name, (kind, _) in rows.items():
        assert kind == FAMILIES[name], name


def test_docs_match_a_full_scrape(run_exporter, scenario, tmp_path):
    # every family some board answers, v1 and v2, with this test's own process on GPU 0 and
    # a kubelet that assigned GPU 0 to a pod
    scenario.write({**health_machine(), "gpu.0.processes": f"{os.getpid()}:{GIB}"})
    directory = short_socket_dir()
    kubelet = FakeKubelet(os.path.join(directory, "kubelet.sock"))
    kubelet.pods = [Pod("ml", "train-0", [Container("trainer", [Device("nvidia.com/gpu", [board_uuid("hopper", 0)])])])]
    kubelet.start()
    try:
        served, s = _full_scrape(run_exporter, scenario, kubelet.socket_path)
    finally:
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    # the amdgpu-only families (junction temperature, GTT) from an AMD scrape
    from fake_sysfs import standard

    amd = run_exporter("--gpu.backend=amdgpu", f"--path.sysfs={standard(tmp_path / 'sys').root}", "--no-collector.kubernetes").scrape()
    amd_served = {name for name in amd.samples if name.startswith("resmon_")}
    prof = _profiling_scrape(run_exporter, scenario)
    prof_served = {name for name in prof.samples if name.startswith("resmon_")}
    rows = doc_rows()
    assert served | amd_served | prof_served == set(rows), (served | amd_served | prof_served) ^ set(rows)
    for scrape in (s, amd, prof):
        for name, (kind, labels) in rows.items():
            if name not in scrape.samples:
                continue
            family = scrape.families[name[: -len("_total")] if kind == "counter" else name]
            assert family.type == kind, name
            for sample_labels, _ in scrape.series(name):
                assert set(sample_labels) == labels, (name, sample_labels)


def _profiling_scrape(run_exporter, scenario):
    """The profiling and mig families: the MIG machine, with every GPM metric answered
    somewhere (the H200's fp64 and fp16, every metric of GPU instance 1)."""
    every = {1: 10, 2: 20, 3: 30, 5: 40, 10: 50, 11: 60, 12: 70, 13: 80, 20: 90, 21: 100, 60: 110, 61: 120}
    scenario.write({**profiling_machine(), "gpu.1.gpm.11": 5, "gpu.1.gpm_rc.13": 0,
                    **{f"gpu.0.gi.1.gpm.{mid}": v for mid, v in every.items()}})
    exporter = run_exporter("--no-collector.kubernetes")
    return exporter.wait_for(lambda s: s.has("resmon_gpu_fp16_active_ratio") and s.has("resmon_gpu_mig_fp16_active_ratio"))


def _full_scrape(run_exporter, scenario, socket_path: str):
    exporter = run_exporter("--collector.processes", f"--kubernetes.pod-resources-socket={socket_path}")
    exporter.wait_ready()  # before the first GPU read a scrape has no GPU families
    exporter.wait_for(lambda s: s.has("resmon_collector_success", collector="xid"))  # registered
    scenario.update(xid_events=f"{board_uuid('hopper', 0)}:79")  # XID series appear at their first event
    s = exporter.wait_for(lambda s: s.has("resmon_gpu_xid_errors_total"))
    return {name for name in s.samples if name.startswith("resmon_")}, s


def test_docs_cover_the_v1_contract():
    # The committed copy keeps this test independent of a checkout of shared/; where shared/
    # is there, the copy must be current.
    text = SPEC_COPY.read_text()
    if SPEC.exists():
        assert SPEC.read_text() == text, f"{SPEC_COPY} is out of date: copy {SPEC} over it"
    v1 = text.split("# Added in v2")[0]  # v2 families arrive with the issues that build them
    contract = set()
    for line in v1.splitlines():
        first = line.strip().strip("|").split("|")[0]
        contract |= set(re.findall(r"`(resmon_[a-z0-9_]+)`", first))
    assert len(contract) >= 30, contract  # every v1 family was parsed
    assert contract <= set(doc_rows()), contract - set(doc_rows())


def test_ci_runs_exactly_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    match = re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.+?)\n```", readme, re.S)
    assert match, "README must mark its test command with <!-- test-command -->"
    command = match.group(1).strip()
    assert command in ci.splitlines()
