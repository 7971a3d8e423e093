"""docs/metrics.md, the collector and a real scrape must agree; README and CI too."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from resmon_exporter.cli import FLAGS
from resmon_exporter.collectors.registry import FAMILIES
from fake_kubelet import Claim, Container, Device, DraDevice, FakeKubelet, Pod, short_socket_dir
from fakenvml import GIB, REPO
from scenarios import board_uuid, health_machine, profiling_machine
from workloads import procfs_tree

DOC = REPO / "docs" / "metrics.md"
SPEC = REPO.parent / "shared" / "spec" / "metrics.md"
SPEC_COPY = REPO / "tests" / "data" / "metrics-contract.md"


def doc_rows() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `resmon_"):  # table rows only: prose may start with a family name
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3:
            labels = set(re.findall(r"`([a-z_]+)`", cells[2]))
            rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def test_docs_list_exactly_the_collectors_families():
    rows = doc_rows()
    assert set(rows) == set(FAMILIES)
    for name, (kind, _) in rows.items():
        assert kind == FAMILIES[name], name


def test_docs_match_a_full_scrape(run_exporter, scenario, workloads, tmp_path):
    # every family some board answers, v1 and v2, with this test's own process on GPU 0, a
    # Slurm job's process on GPU 1 and a kubelet that assigned GPU 0 to a pod
    job = workloads.start("srunstep")
    proc = procfs_tree(tmp_path / "proc", {
        os.getpid(): Path("/proc/self/cgroup").read_text(),
        job: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
    })
    scenario.write({**health_machine(), "gpu.0.processes": f"{os.getpid()}:{GIB}", "gpu.1.processes": f"{job}:{GIB}"})
    directory = short_socket_dir()
    kubelet = FakeKubelet(os.path.join(directory, "kubelet.sock"))
    kubelet.pods = [Pod("ml", "train-0", [Container("trainer", [Device("nvidia.com/gpu", [board_uuid("hopper", 0)])])]),
                    # a DRA claim: resmon_kubernetes_unresolved_devices is served for each DRA driver named
                    Pod("ml", "dra-0", [Container("c", [], claims=[Claim("gpu", [DraDevice("gpu.nvidia.com", "gpu-1")])])])]
    kubelet.start()
    try:
        served, s = _full_scrape(run_exporter, scenario, kubelet.socket_path, proc)
    finally:
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)
    # the amdgpu-only families (junction temperature, GTT) from an AMD scrape
    from fake_sysfs import standard

    amd = run_exporter("--gpu.backend=amdgpu", f"--path.sysfs={standard(tmp_path / 'sys').root}", "--no-collector.kubernetes").scrape()
    amd_served = {name for name in amd.samples if name.startswith("resmon_")}
    prof = _profiling_scrape(run_exporter, scenario)
    prof_served = {name for name in prof.samples if name.startswith("resmon_")}
    # the failure-only family: GPUs this process may not open (NVML NO_PERMISSION)
    scenario.write({**health_machine(), "rc.nvmlDeviceGetHandleByIndex_v2": 4})
    denied = run_exporter("--no-collector.kubernetes", "--collect.cache-ttl=0").wait_for(
        lambda s: s.has("resmon_collector_error_info"))
    denied_served = {name for name in denied.samples if name.startswith("resmon_")}
    rows = doc_rows()
    served |= amd_served | prof_served | denied_served
    assert served == set(rows), served ^ set(rows)
    for scrape in (s, amd, prof, denied):  # every collector and backend a scrape names is one the docs' checks know
        assert {l["collector"] for l, _ in scrape.series("resmon_collector_success")} <= code_collectors()
        assert {l["backend"] for l, _ in scrape.series("resmon_gpu_backend_info")} <= code_backend_names()
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


def _full_scrape(run_exporter, scenario, socket_path: str, proc: Path):
    exporter = run_exporter("--collector.processes", f"--path.procfs={proc}", f"--kubernetes.pod-resources-socket={socket_path}")
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


# -- statements the code keeps (issue 22 item 10): each truth is derived from the code ---------

EXPORTER = REPO / "exporter"
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _string(node: ast.expr, constants: dict[str, str]) -> str | None:
    """A thread name as the code writes it: a literal, a module constant, or an f-string
    whose placeholders (the GPU index) read N."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "N" for v in node.values)
    return None


def code_thread_names() -> set[str]:
    """Every thread the exporter starts: threading.Thread(name=...) and the pools'
    thread_name_prefix=..., found in the source."""
    names = set()
    for path in EXPORTER.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in ("Thread", "ThreadPoolExecutor"):  # every thread is named, so the table can name it
                assert {kw.arg for kw in node.keywords} & {"name", "thread_name_prefix"}, f"{path}:{node.lineno}: unnamed"
            for kw in node.keywords:
                if (kw.arg == "name" and func == "Thread") or kw.arg == "thread_name_prefix":
                    name = _string(kw.value, constants)
                    assert name is not None, f"{path}:{node.lineno}: a thread name the docs test cannot read"
                    names.add(name)
    return names


def doc_section(heading: str) -> str:
    text = DOC.read_text()
    assert heading in text, f"{DOC} has no {heading!r} section"
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end != -1 else len(text)]


def test_docs_name_exactly_the_threads_the_code_starts():
    for path in USER_DOCS:  # the XID watcher is one of several
        text = " ".join(path.read_text().split())
        claim = re.search(r"[^.(]*only (long-lived )?background thread[^.)]*", text)
        assert not claim, f"{path.name}: {claim.group(0).strip()!r}"
    code = code_thread_names()
    assert {"resmon-gpu", "resmon-gpu-read-N", "resmon-xid"} <= code, code  # the parse found them
    documented = set()
    for line in doc_section("## Threads").splitlines():
        first = line.strip().strip("|").split("|")[0].strip()
        documented |= set(re.findall(r"`(resmon-[a-zA-Z0-9-]+)`", first))
    assert documented == code, f"docs/metrics.md '## Threads' and the code differ: {documented ^ code}"


def _meaning(family: str) -> str:
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == f"`{family}`":
            return "|".join(cells[4:])
    raise AssertionError(f"{family} has no row in {DOC}")


def code_backend_names() -> set[str]:
    """The `name` class attribute of every backend class (what resmon_gpu_backend_info says)."""
    names = set()
    for path in (EXPORTER / "backends").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (isinstance(item, ast.Assign) and [getattr(t, "id", "") for t in item.targets] == ["name"]
                            and isinstance(item.value, ast.Constant)):
                        names.add(item.value.value)
    return names


def test_backend_info_lists_every_backend():
    from resmon_exporter.backends import BACKEND_CHOICES

    code = code_backend_names()
    assert code == set(BACKEND_CHOICES) - {"auto"}, code  # every choice is a backend with that name
    documented = set(re.findall(r"`([a-z-]+)`", _meaning("resmon_gpu_backend_info").split(":")[0]))
    assert documented == code, f"resmon_gpu_backend_info values: docs {sorted(documented)}, code {sorted(code)}"


def code_collectors() -> set[str]:
    """The collectors: one --[no-]collector.X switch each."""
    return {f.name.split(".", 1)[1] for f in FLAGS if f.boolean and f.name.startswith("collector.")}


def test_collector_success_lists_every_collector():
    code = code_collectors()
    assert {"gpu", "profiling", "mig", "host"} <= code, code
    listed = re.search(r"1 when that collector's \(([^)]*)\)", _meaning("resmon_collector_success"))
    assert listed, "the resmon_collector_success row lists the collectors in parentheses"
    documented = set(re.findall(r"`([a-z]+)`", listed.group(1)))
    assert documented == code, f"resmon_collector_success collectors: docs {sorted(documented)}, code {sorted(code)}"


# -- what a newcomer trips on (issue 22 item 14) --------------------------------------------


def test_test_sh_without_apt_get_names_what_to_install(tmp_path):
    # a machine that is not Debian (or a container without apt): one line that says which
    # tools are missing and what to install, exit 1, not "apt-get: command not found"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "id"):  # what the script runs before it looks for the tools
        os.symlink(shutil.which(tool), bin_dir / tool)
    result = subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "test.sh")], capture_output=True, text=True,
                            timeout=60, env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "command not found" not in result.stderr, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.startswith("test.sh:")]
    assert len(lines) == 1, result.stderr
    for tool in ("promtool", "gcc", "readelf", "systemd-analyze", "fusermount3", "apt-get"):
        assert tool in lines[0], (tool, lines[0])


def test_readme_installs_into_a_venv_not_the_system_python():
    # Debian 12's system pip refuses `pip install .` (externally-managed-environment, PEP 668)
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Install and run"):]
    first = re.search(r"```sh\n(.+?)\n```", section, re.S)
    assert first, "the install section starts with a shell block"
    command = first.group(1)
    venv = re.match(r"python3 -m venv (\S+) && \1/bin/pip install \. && \1/bin/resmon-exporter$", command)
    assert venv or command.startswith("pipx install"), f"README's first command installs into the system Python: {command!r}"


def test_the_memory_figures_of_the_performance_doc_and_the_kubernetes_guide_are_one_run():
    """README and docs/kubernetes.md once quoted RSS from different runs (35.7 / 55.5 MiB
    beside 32.8 / 42.7 MiB): every RSS figure the guide's Resources section gives must be one
    of docs/performance.md's memory sentence for a Kubernetes node, which names both a bare host and a
    node with the kubelet socket (grpcio loaded)."""
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    resources = guide.split("\n## Resources\n", 1)[1].split("\n## ", 1)[0]
    performance = (REPO / "docs" / "performance.md").read_text()  # the figures moved there from the README
    sentence = re.search(r"Memory on a Kubernetes node[^\n]*(?:\n(?!\n)[^\n]*)*", performance)
    assert sentence, "docs/performance.md has no 'Memory on a Kubernetes node' paragraph"
    figure = re.compile(r"(\d+(?:\.\d+)?) MiB")
    ours = set(figure.findall(sentence.group(0)))
    rss = [sentence for sentence in re.split(r"(?<=[.;])\s", resources) if "RSS" in sentence]
    theirs = {f for sentence in rss for f in figure.findall(sentence)}
    assert len(ours) >= 2 and theirs, (ours, theirs)
    assert theirs <= ours, f"docs/kubernetes.md quotes {sorted(theirs - ours)} MiB, docs/performance.md {sorted(ours)}"


def test_no_file_points_at_a_path_outside_the_repository():
    # issue 35 item 5: the fake's docstrings named the briefs of the machine the code was
    # written on, which a clone does not have
    outside = re.compile("/" + r"work/(?:briefs|shared|main)\b")
    files = [*USER_DOCS, *(REPO / "tests").rglob("*.py"), *(REPO / "tests" / "fake_nvml").glob("*.[ch]"),
             *(REPO / "examples").rglob("*"), *(EXPORTER.rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}: {match.group(0)}" for path in files if path.is_file()
             for match in outside.finditer(path.read_text(errors="replace"))]
    assert not found, found



# -- the README as a front door, the reference in docs/ (issue 36 part 2, issue 35 item 5) --

README = REPO / "README.md"
FLAGS_DOC = REPO / "docs" / "flags.md"
ALERTS_DOC = REPO / "docs" / "alerts.md"
SECURITY_DOC = REPO / "docs" / "security.md"
RULES = REPO / "prometheus" / "rules" / "resmon.rules.yml"


def test_the_readme_is_a_front_door_not_a_reference_or_a_log():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250, f"README has {len(lines)} lines: move reference to docs/"
    first = text.split("\n\n")[1]  # the paragraph under the title: what it is
    for word in ("NVIDIA", "AMD", "Intel", "per-process", "pod", "job", "Python API"):
        assert word in first, (word, first)
    head = "\n".join(lines[:60])  # the first screen: the install-and-run line and the test line
    assert "bin/pip install . && " in head and "./scripts/test.sh" in head, head
    # a development log speaks to the project, not to users: history is in CHANGELOG.md
    log = re.findall(r"\b(?:issue \d+|this round|commit [0-9a-f]{7}|[0-9a-f]{7,40}\b(?=[ ,)]))", text)
    assert not [m for m in log if not m.isdecimal()], log


def test_the_package_description_names_every_vendor():
    text = (REPO / "pyproject.toml").read_text()  # no tomllib on Python 3.10, which runs this too
    description = re.search(r'^description = "([^"]*)"$', text, re.M)
    keywords = re.search(r"^keywords = \[([^]]*)\]$", text, re.M)
    assert description and keywords, "pyproject.toml spells description and keywords on one line each"
    for word in ("NVIDIA", "AMD", "Intel"):
        assert word in description.group(1), description.group(1)
    assert {"nvidia", "amd", "intel"} <= set(re.findall(r'"([^"]+)"', keywords.group(1))), keywords.group(1)


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| `--")]


def _documented_default(flag, cell: str):
    """A default as the table writes it, in the flag's own type: `2m` is 120.0."""
    cell = cell.strip("*`")
    if flag.boolean:
        return {"on": True, "off": False}[cell]
    if cell == "none":
        return ""
    return flag.convert(cell)


def test_docs_flags_lists_every_flag_with_its_variable_and_default():
    rows = {r[0]: r for r in _table_rows(FLAGS_DOC.read_text())}
    spelled = {(f"`--[no-]{f.name}`" if f.boolean else f"`--{f.name}`"): f for f in FLAGS}
    assert set(rows) - {"`--version`"} == set(spelled), set(rows) ^ set(spelled)
    for name, flag in spelled.items():
        row = rows[name]
        assert row[1] == f"`{flag.env}`", (name, row[1])
        assert _documented_default(flag, row[2]) == flag.default, (name, row[2], flag.default)


def test_the_readme_flags_are_real_flags_with_their_defaults():
    section = README.read_text().split("## The flags people change", 1)[1].split("\n## ", 1)[0]
    rows = _table_rows(section)
    assert len(rows) == 10, len(rows)
    by_name = {(f"`--[no-]{f.name}`" if f.boolean else f"`--{f.name}`"): f for f in FLAGS}
    for row in rows:
        assert row[0] in by_name, row[0]
        assert _documented_default(by_name[row[0]], row[1]) == by_name[row[0]].default, row


def test_the_alerts_doc_names_every_alert_and_recording_rule():
    import yaml

    rules = [rule for path in sorted(RULES.parent.glob("*.yml"))  # resmon.rules.yml, resmon.waste.rules.yml
             for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    alerts = {rule["alert"] for rule in rules if "alert" in rule}
    records = {rule["record"] for rule in rules if "record" in rule}
    assert len(alerts) >= 20 and len(records) >= 3, (alerts, records)  # the file was read
    text = ALERTS_DOC.read_text()
    table = {row[0].strip("`") for row in ([c.strip() for c in l.strip().strip("|").split("|")]
                                           for l in text.splitlines() if l.startswith("| `Resmon"))}
    assert table == alerts, f"alert table vs rules file: {sorted(table ^ alerts)}"
    recording = "\n".join(part.split("\n\n", 1)[0] for part in text.split("Recording rules:")[1:])
    assert set(re.findall(r"`([a-z0-9_]+:[a-z0-9_]+:[a-z0-9_]+)`", recording)) == records, recording


def test_the_shipped_web_config_is_refused_for_the_reason_the_docs_name(tmp_path):
    # issue 35 item 5: the README said the example is refused for its placeholder hash; as
    # shipped it is refused first for the certificate it names and nobody has yet
    result = subprocess.run([sys.executable, "-m", "resmon_exporter", "--web.config.file=examples/web-config.yml",
                             "--gpu.backend=none", "--web.listen-address=127.0.0.1:0"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    reason = re.search(r"(tls_server_config\.cert_file: file ')[^']*(server\.crt' does not exist)", lines[0])
    assert reason, lines[0]
    documented = " ".join(SECURITY_DOC.read_text().split())
    assert f"`{reason.group(1)}.../{reason.group(2)}`" in documented, "docs/security.md names another reason"
    assert "`basic_auth_users.prometheus: not a bcrypt hash`" in documented  # the second, once certificates exist


def test_links_between_the_docs_lead_somewhere():
    """The reference moved out of the README: every relative link of the README and docs/
    names a file that exists and, for a Markdown file, a heading it has."""

    def anchors(path: Path) -> set[str]:
        found = set()
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                found.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
        return found

    broken = []
    for doc in USER_DOCS + [REPO / "CHANGELOG.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken
