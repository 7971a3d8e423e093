"""deploy/kubernetes, validated offline (no cluster here): every overlay (and the combinations
docs/kubernetes.md promises) is built with the real `kubectl kustomize`, every built object is
checked against Kubernetes' own schemas (kubernetes-validate, strict) for the oldest and newest
Kubernetes we support, the Prometheus Operator objects (ServiceMonitor or PodMonitor, and the
PrometheusRule) against its CRD models (cloudcoil, made strict about unknown fields here), the
PrometheusRule's rules with promtool, the generated objects against their sources
(deploy/kubernetes/generate.py), and the image: one `images:` entry that every build takes.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as promop
from pydantic import ValidationError as PydanticValidationError

from resmon_exporter.cli import FLAGS, parse_config
from resmon_exporter.version import __version__

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
RULES = REPO / "prometheus" / "rules" / "resmon.rules.yml"  # the exporter's own alerts
RULE_FILES = sorted((REPO / "prometheus" / "rules").glob("*.yml"))  # every file the PrometheusRule carries
DASHBOARDS = REPO / "dashboards"
DOCS = REPO / "docs" / "kubernetes.md"

# Oldest: the PodResources v1 API the kubernetes collector uses went GA in 1.28. Newest: the
# newest schemas kubernetes-validate ships (1.37.0). Strings as kubernetes_validate takes them.
K8S_VERSIONS = ("1.28.0", "1.37.0")

OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if (p / "kustomization.yaml").is_file())
# the two ways the Prometheus Operator finds the exporter: one or the other, never both
MONITORS = {"prometheus-operator": "ServiceMonitor", "podmonitor": "PodMonitor"}
# combinations a user may build (docs/kubernetes.md); amd excludes nvidia-runtime-class,
# non-root excludes what needs the host (process-attribution, privileged), and podmonitor
# excludes prometheus-operator
EXCLUSIVE = [{"amd", "nvidia-runtime-class"}, {"non-root", "process-attribution"}, {"non-root", "privileged"},
             set(MONITORS)]
COMBINATIONS = {
    "all-nvidia": ("prometheus-operator", "grafana", "process-attribution", "privileged", "nvidia-runtime-class", "gke"),
    "all-amd": ("prometheus-operator", "grafana", "process-attribution", "privileged", "amd"),
    "restricted": ("prometheus-operator", "grafana", "non-root"),
    "all-nvidia-podmonitor": ("podmonitor", "grafana", "process-attribution", "privileged", "nvidia-runtime-class", "gke"),
    "restricted-podmonitor": ("podmonitor", "grafana", "non-root"),
}
# what each build is made of: overlays/<component> is the base plus that component
MADE_OF: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in COMPONENTS},
    "kube-prometheus-stack": ("prometheus-operator", "grafana"),
    **COMBINATIONS,
}
BUILDS = OVERLAYS + sorted(COMBINATIONS)
NVIDIA_BUILDS = [b for b in BUILDS if "amd" not in MADE_OF[b]]


def monitor_kind(build: str) -> str | None:
    """The kind of monitor a build has: ServiceMonitor, PodMonitor or None."""
    [*kinds] = (kind for component, kind in MONITORS.items() if component in MADE_OF[build])
    assert len(kinds) <= 1, f"{build}: both monitors"
    return kinds[0] if kinds else None


MONITORED_BUILDS = [b for b in BUILDS if monitor_kind(b)]
VERSIONED_KUBECTL = Path("/usr/lib/google-cloud-sdk/bin")


# -- building ------------------------------------------------------------------------------
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        # a skip, which CI=true turns into a failure (tests/ci_policy.py)
        pytest.skip("kubectl missing (any kubectl >= 1.21: kustomize Components)")
    return path


def oldest_versioned_kubectl() -> str | None:
    """The oldest kubectl.1.N beside the google-cloud-sdk's kubectl (1.27: kustomize v5.0.1);
    machines without that SDK test the default kubectl only."""
    found = []
    for path in VERSIONED_KUBECTL.glob("kubectl.1.*"):
        match = re.fullmatch(r"kubectl\.1\.(\d+)", path.name)
        if match:
            found.append((int(match.group(1)), str(path)))
    return min(found)[1] if found else None


def kustomize(binary: str, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([binary, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{binary} kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


def user_tree(tmp: Path) -> Path:
    """A directory laid out like deploy/kubernetes (base and components linked in), so a
    user's kustomization at overlays/<x>/ can be built outside the repo."""
    for name in ("base", "components"):
        (tmp / name).symlink_to(K8S / name, target_is_directory=True)
    (tmp / "overlays").mkdir()
    return tmp / "overlays"


def write_kustomization(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "kustomization.yaml").write_text(text)
    return directory


@pytest.fixture(scope="module")
def build_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    overlays = user_tree(tmp_path_factory.mktemp("combinations"))
    dirs = {name: K8S / "overlays" / name for name in OVERLAYS}
    for name, components in COMBINATIONS.items():
        body = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["../../base"],
            "components": [f"../../components/{c}" for c in components],
        }
        dirs[name] = write_kustomization(overlays / name, yaml.safe_dump(body))
    return dirs


@pytest.fixture(scope="module")
def built(build_dirs: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    binary = kubectl()
    return {name: kustomize(binary, path) for name, path in build_dirs.items()}


def objects(built: dict[str, list[dict[str, Any]]], build: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in built[build] if o["kind"] == kind]


def one(built: dict[str, list[dict[str, Any]]], build: str, kind: str) -> dict[str, Any]:
    found = objects(built, build, kind)
    assert len(found) == 1, f"{build}: {len(found)} {kind} objects"
    return found[0]


def pod_spec(built: dict[str, list[dict[str, Any]]], build: str) -> dict[str, Any]:
    return one(built, build, "DaemonSet")["spec"]["template"]["spec"]


def container(built: dict[str, list[dict[str, Any]]], build: str) -> dict[str, Any]:
    containers = pod_spec(built, build)["containers"]
    assert len(containers) == 1
    return containers[0]


def test_every_component_has_an_overlay_and_every_overlay_is_accounted_for() -> None:
    assert COMPONENTS, "no components found"
    assert set(COMPONENTS) <= set(OVERLAYS), "overlays/<name> missing for a component"
    assert set(OVERLAYS) == set(MADE_OF) - set(COMBINATIONS)
    for name in COMPONENTS:
        text = (K8S / "overlays" / name / "kustomization.yaml").read_text()
        assert yaml.safe_load(text)["components"] == [f"../../components/{name}"]
        component = yaml.safe_load((K8S / "components" / name / "kustomization.yaml").read_text())
        assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")


@pytest.mark.parametrize("build", BUILDS)
def test_builds(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    kinds = sorted(o["kind"] for o in built[build])
    expected = ["DaemonSet", "Service", "ServiceAccount"]
    if monitor_kind(build):
        expected += ["PrometheusRule", monitor_kind(build)]
    if "grafana" in MADE_OF[build]:
        expected += ["ConfigMap"] * len(list(DASHBOARDS.glob("*.json")))
    if "gke" in MADE_OF[build]:
        expected += ["ResourceQuota"]
    assert kinds == sorted(expected)


OLDEST_KUBECTL = oldest_versioned_kubectl()
# Defined only where the SDK's versioned kubectls exist: elsewhere only the default kubectl is
# tested, deliberately (a skip would fail CI=true runs on machines that never had them).
if OLDEST_KUBECTL is not None:

    def test_the_oldest_kubectl_builds_the_same(build_dirs: dict[str, Path], built: dict[str, list[dict[str, Any]]]) -> None:
        assert OLDEST_KUBECTL is not None
        for name, path in build_dirs.items():
            assert kustomize(OLDEST_KUBECTL, path) == built[name], f"{OLDEST_KUBECTL} builds {name} differently"


# -- Kubernetes schemas ----------------------------------------------------------------------
def core_objects(built: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for build, docs in built.items():
        for doc in docs:
            if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
                yield build, doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_kubernetes(built: dict[str, list[dict[str, Any]]], version: str) -> None:
    checked = 0
    for build, doc in core_objects(built):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{build}: {doc['kind']} {doc['metadata']['name']} invalid for {version}: {exc}")
        checked += 1
    assert checked >= 3 * len(built)


def built_daemonset(built: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return copy.deepcopy(one(built, "prometheus-operator", "DaemonSet"))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validation_can_fail(built: dict[str, list[dict[str, Any]]], version: str) -> None:
    kubernetes_validate.validate(built_daemonset(built), version, strict=True)  # the control
    string_port = built_daemonset(built)
    string_port["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9636"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(string_port, version, strict=True)
    unknown = built_daemonset(built)
    unknown["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    kubernetes_validate.validate(unknown, version, strict=False)  # only strict catches typos
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, version, strict=True)


# -- enums: kubernetes-validate's schemas have none ------------------------------------------
# Kubernetes' OpenAPI documents list allowed values in descriptions only, so `operator: Exist`,
# `effect: NoSchedul` or `operator: in` pass the schema check and fail (or, for a toleration,
# silently tolerate nothing) on a real API server. Every enum-valued field the manifests use,
# by kind and path ("[]" for any list item), with the values the API accepts.
POD = "spec.template.spec"
SELECTOR_OPS = {"In", "NotIn", "Exists", "DoesNotExist"}
RELABEL_ACTIONS = {a for name in ("replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                                  "lowercase", "uppercase", "keepequal", "dropequal")
                   for a in (name, name.capitalize())}  # the Operator accepts both spellings
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
ENUMS: dict[tuple[str, str], set[Any]] = {
    ("DaemonSet", "spec.updateStrategy.type"): {"RollingUpdate", "OnDelete"},
    ("DaemonSet", f"{POD}.tolerations[].operator"): {"Exists", "Equal"},
    ("DaemonSet", f"{POD}.tolerations[].effect"): {"NoSchedule", "PreferNoSchedule", "NoExecute"},
    ("DaemonSet", f"{POD}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                  ".nodeSelectorTerms[].matchExpressions[].operator"): SELECTOR_OPS | {"Gt", "Lt"},
    ("DaemonSet", f"{POD}.securityContext.seccompProfile.type"): {"RuntimeDefault", "Unconfined", "Localhost"},
    ("DaemonSet", f"{POD}.containers[].securityContext.seccompProfile.type"): {"RuntimeDefault", "Unconfined", "Localhost"},
    ("DaemonSet", f"{POD}.containers[].imagePullPolicy"): {"Always", "IfNotPresent", "Never"},
    ("DaemonSet", f"{POD}.containers[].ports[].protocol"): {"TCP", "UDP", "SCTP"},
    ("DaemonSet", f"{POD}.containers[].securityContext.capabilities.drop[]"): {"ALL"},
    **{("DaemonSet", f"{POD}.containers[].{probe}.httpGet.scheme"): {"HTTP", "HTTPS"} for probe in PROBES},
    ("DaemonSet", f"{POD}.volumes[].hostPath.type"): {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File",
                                                       "Socket", "CharDevice", "BlockDevice"},
    ("Service", "spec.type"): {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
    ("Service", "spec.clusterIP"): {"None"},  # headless: any other value would be a fixed virtual IP
    ("Service", "spec.ports[].protocol"): {"TCP", "UDP", "SCTP"},
    ("ResourceQuota", "spec.scopeSelector.matchExpressions[].operator"): SELECTOR_OPS,
    ("ResourceQuota", "spec.scopeSelector.matchExpressions[].scopeName"): {
        "Terminating", "NotTerminating", "BestEffort", "NotBestEffort", "PriorityClass", "CrossNamespacePodAffinity"},
    ("ServiceMonitor", "spec.endpoints[].relabelings[].action"): RELABEL_ACTIONS,
    ("ServiceMonitor", "spec.endpoints[].metricRelabelings[].action"): RELABEL_ACTIONS,
    ("ServiceMonitor", "spec.endpoints[].scheme"): {"http", "https"},
    ("ServiceMonitor", "spec.selector.matchExpressions[].operator"): SELECTOR_OPS,
    ("PodMonitor", "spec.podMetricsEndpoints[].relabelings[].action"): RELABEL_ACTIONS,
    ("PodMonitor", "spec.podMetricsEndpoints[].metricRelabelings[].action"): RELABEL_ACTIONS,
    ("PodMonitor", "spec.podMetricsEndpoints[].scheme"): {"http", "https"},
    ("PodMonitor", "spec.selector.matchExpressions[].operator"): SELECTOR_OPS,
}
# a leaf whose key is one of these is an enum somewhere: it must be in the table above
ENUM_KEYS = {"operator", "effect", "type", "protocol", "imagePullPolicy", "action", "scheme", "scopeName",
             "restartPolicy", "dnsPolicy", "clusterIP", "drop", "add", "preemptionPolicy"}


def leaves(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar in node; list items are "[]"."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for item in node:
            yield from leaves(item, f"{path}[]")
    else:
        yield path, node


def enum_violations(doc: dict[str, Any]) -> list[str]:
    bad = []
    for path, value in leaves(doc):
        allowed = ENUMS.get((doc["kind"], path))
        if allowed is not None:
            if value not in allowed:
                bad.append(f"{doc['kind']} {path}: {value!r} not in {sorted(allowed)}")
        elif re.sub(r"\[\]$", "", path).rsplit(".", 1)[-1] in ENUM_KEYS and doc["kind"] not in ("ConfigMap", "PrometheusRule"):
            bad.append(f"{doc['kind']} {path}: an enum-like field the ENUMS table does not know")
    return bad


def test_every_enum_valued_field_holds_an_allowed_value(built: dict[str, list[dict[str, Any]]]) -> None:
    seen: set[tuple[str, str]] = set()
    for build, docs in built.items():
        for doc in docs:
            assert enum_violations(doc) == [], build
            seen |= {(doc["kind"], path) for path, _ in leaves(doc)} & set(ENUMS)
    # the walk does reach the fields it is meant for
    assert {("DaemonSet", f"{POD}.tolerations[].operator"), ("DaemonSet", f"{POD}.tolerations[].effect"),
            ("ResourceQuota", "spec.scopeSelector.matchExpressions[].operator"),
            ("ServiceMonitor", "spec.endpoints[].relabelings[].action"), ("Service", "spec.clusterIP"),
            ("PodMonitor", "spec.podMetricsEndpoints[].relabelings[].action")} <= seen


@pytest.mark.parametrize("typo", [
    ("tolerations", 0, "operator", "Exist"),
    ("tolerations", 0, "effect", "NoSchedul"),
    ("affinity", 0, "operator", "in"),
])
def test_enum_typos_pass_the_schemas_but_not_the_enum_check(built: dict[str, list[dict[str, Any]]],
                                                           typo: tuple[str, int, str, str]) -> None:
    where, index, field, value = typo
    doc = built_daemonset(built)
    spec = doc["spec"]["template"]["spec"]
    if where == "tolerations":
        spec["tolerations"][index][field] = value
    else:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        terms[index]["matchExpressions"][0][field] = value
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)  # the schemas let it through
    assert [v for v in enum_violations(doc) if repr(value) in v], enum_violations(doc)
    # and a field the table does not know is reported, not skipped
    doc = built_daemonset(built)
    doc["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
    assert any("dnsPolicy" in v and "does not know" in v for v in enum_violations(doc))


# -- Prometheus Operator schemas -------------------------------------------------------------
CR_MODELS = {"ServiceMonitor": promop.ServiceMonitor, "PodMonitor": promop.PodMonitor, "PrometheusRule": promop.PrometheusRule}


def _closed(schema: Any) -> Any:
    """The schema with additionalProperties false wherever an object lists its properties:
    the models ignore unknown fields, the Operator's CRDs (structural schemas) drop them."""
    if isinstance(schema, dict):
        out = {key: _closed(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


STRICT_CR_SCHEMAS = {kind: _closed(model.model_json_schema(by_alias=True)) for kind, model in CR_MODELS.items()}


def validate_cr(doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    assert kind in CR_MODELS, f"no schema for {doc['apiVersion']} {kind}"
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    CR_MODELS[kind].model_validate(doc)  # types, enums, patterns
    jsonschema.Draft202012Validator(STRICT_CR_SCHEMAS[kind]).validate(doc)  # and no unknown field


def test_every_prometheus_operator_object_is_valid(built: dict[str, list[dict[str, Any]]]) -> None:
    checked = 0
    for build, docs in built.items():
        for doc in docs:
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                validate_cr(doc)
                checked += 1
    assert checked == 2 * len(MONITORED_BUILDS)
    assert {b for b in built if monitor_kind(b) == "PodMonitor"} >= {"podmonitor", "all-nvidia-podmonitor"}


def test_prometheus_operator_validation_can_fail(built: dict[str, list[dict[str, Any]]]) -> None:
    monitor = one(built, "prometheus-operator", "ServiceMonitor")
    rule = one(built, "prometheus-operator", "PrometheusRule")
    validate_cr(monitor)
    typo = copy.deepcopy(monitor)
    typo["spec"]["endpoints"][0]["honorLabel"] = typo["spec"]["endpoints"][0].pop("honorLabels")
    promop.ServiceMonitor.model_validate(typo)  # the model alone lets it through
    with pytest.raises(jsonschema.ValidationError, match="honorLabel"):
        validate_cr(typo)
    number = copy.deepcopy(monitor)
    number["spec"]["endpoints"][0]["interval"] = 15
    with pytest.raises(PydanticValidationError, match="interval"):
        validate_cr(number)
    pod_monitor = one(built, "podmonitor", "PodMonitor")
    validate_cr(pod_monitor)
    typo = copy.deepcopy(pod_monitor)
    typo["spec"]["podMetricsEndpoints"][0]["honorLabel"] = typo["spec"]["podMetricsEndpoints"][0].pop("honorLabels")
    promop.PodMonitor.model_validate(typo)
    with pytest.raises(jsonschema.ValidationError, match="honorLabel"):
        validate_cr(typo)
    typo = copy.deepcopy(pod_monitor)
    typo["spec"]["endpoints"] = typo["spec"].pop("podMetricsEndpoints")  # the ServiceMonitor's field name
    with pytest.raises((PydanticValidationError, jsonschema.ValidationError)):
        validate_cr(typo)
    number = copy.deepcopy(pod_monitor)
    number["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"] = 10
    with pytest.raises(PydanticValidationError, match="scrapeTimeout"):
        validate_cr(number)
    bad_rule = copy.deepcopy(rule)
    bad_rule["spec"]["groups"][0]["rules"][0]["expresion"] = bad_rule["spec"]["groups"][0]["rules"][0].pop("expr")
    with pytest.raises((PydanticValidationError, jsonschema.ValidationError)):
        validate_cr(bad_rule)


def test_promtool_accepts_the_prometheusrule(built: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: scripts/test.sh installs Debian's prometheus")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(one(built, "prometheus-operator", "PrometheusRule")["spec"], sort_keys=False))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout + done.stderr)


# -- one source of truth: generated objects equal their sources ------------------------------
def load_generator() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(K8S / "generate.py"), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    generator = load_generator()
    for rel in (generator.RULE_OUT, generator.DASHBOARD_OUT):
        fresh = (tmp_path / rel).read_bytes()
        committed = (K8S / rel).read_bytes()
        assert fresh == committed, f"deploy/kubernetes/{rel} is stale: run `python deploy/kubernetes/generate.py`"
        assert committed.startswith(b"# generated by deploy/kubernetes/generate.py from ")


def test_the_prometheusrule_holds_the_rules_file(built: dict[str, list[dict[str, Any]]]) -> None:
    source = rule_groups()
    assert len(RULE_FILES) >= 2 and {g["name"] for g in source} >= {"resmon.gpu", "resmon.waste"}
    for build in MONITORED_BUILDS:
        assert one(built, build, "PrometheusRule")["spec"] == {"groups": source}


def test_one_dashboard_configmap_per_dashboard_with_its_json(built: dict[str, list[dict[str, Any]]]) -> None:
    sources = {p.name: p.read_text() for p in sorted(DASHBOARDS.glob("*.json"))}
    assert len(sources) >= 2
    for build in BUILDS:
        if "grafana" not in MADE_OF[build]:
            continue
        maps = objects(built, build, "ConfigMap")
        files = {key: value for cm in maps for key, value in cm["data"].items()}
        assert all(len(cm["data"]) == 1 for cm in maps)
        assert set(files) == set(sources), "a dashboard without its ConfigMap, or a stale one"
        for name, text in files.items():
            assert text == sources[name], f"{name}: the ConfigMap's JSON is not dashboards/{name}"
            assert json.loads(text) == json.loads(sources[name])
        for cm in maps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert len(json.dumps(cm)) < 256 * 1024  # client-side apply's annotation limit


# -- content: what the reference sheets and docs/kubernetes.md promise ----------------------
def config(built: dict[str, list[dict[str, Any]]], build: str) -> Any:
    """The exporter's configuration from the container's args, parsed by the exporter's own
    parser: a flag the CLI lacks, or a bad value, fails here."""
    ctr = container(built, build)
    assert "command" not in ctr, "the image's entrypoint is the exporter"
    env = {e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e}
    cfg, warnings = parse_config(ctr["args"], {k: v for k, v in env.items() if k.startswith("RESMON_")})
    assert warnings == []
    return cfg


@pytest.mark.parametrize("build", BUILDS)
def test_every_flag_exists_in_the_cli(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    names = {f.name for f in FLAGS} | {f"no-{f.name}" for f in FLAGS if f.boolean}
    for arg in container(built, build)["args"]:
        assert arg.startswith("--") and arg[2:].split("=", 1)[0] in names, f"{build}: {arg} is not a flag of exporter.cli"
    cfg = config(built, build)
    assert cfg.web_listen_address == ":9636"


def mounts(built: dict[str, list[dict[str, Any]]], build: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (volumeMount, volume)."""
    volumes = {v["name"]: v for v in pod_spec(built, build).get("volumes", [])}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container(built, build).get("volumeMounts", [])}


def host_mount_of(built: dict[str, list[dict[str, Any]]], build: str, path: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The mount holding path (a file or directory in the container)."""
    for mount_path, (mount, volume) in mounts(built, build).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return mount_path, mount, volume
    pytest.fail(f"{build}: nothing is mounted at {path}")


@pytest.mark.parametrize("build", BUILDS)
def test_no_gpu_is_requested(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    spec = pod_spec(built, build)
    for ctr in spec["containers"] + spec.get("initContainers", []):
        resources = ctr.get("resources", {})
        for section in ("requests", "limits"):
            for name in resources.get(section, {}):
                assert not name.startswith(("nvidia.com/", "amd.com/")), f"{build}: {ctr['name']} {section} {name}"
        assert "claims" not in resources  # nor a DRA claim
    assert "resourceClaims" not in spec


@pytest.mark.parametrize("build", BUILDS)
def test_resources(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    resources = container(built, build)["resources"]
    assert resources == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}  # no CPU limit


@pytest.mark.parametrize("build", BUILDS)
def test_pod_resources_directory_is_mounted_read_only(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    cfg = config(built, build)
    if "non-root" in MADE_OF[build]:
        assert cfg.collector_kubernetes is False  # a uid other than 0 cannot connect: off, and no mount
        assert all(v.get("hostPath") is None for _, v in mounts(built, build).values())
        assert all("hostPath" not in v for v in pod_spec(built, build)["volumes"])
        return
    assert cfg.collector_kubernetes is True
    socket = cfg.kubernetes_pod_resources_socket
    mount_path, mount, volume = host_mount_of(built, build, socket)
    assert mount_path == str(Path(socket).parent), "mount the socket's directory, not the socket"
    assert mount["readOnly"] is True
    assert volume["hostPath"] == {"path": mount_path, "type": "Directory"}


IDENTITY_FIELDS = ("runAsUser", "runAsGroup", "runAsNonRoot")


def effective_identity_of(spec: dict[str, Any]) -> tuple[Any, ...]:
    """(uid, gid, runAsNonRoot) the one container runs with: each field of the container's
    securityContext overrides the pod's (Kubernetes' rule); None where neither sets it (the
    image's USER would apply, which these manifests never leave to chance)."""
    [ctr] = spec["containers"]
    pod, own = spec.get("securityContext", {}), ctr.get("securityContext", {})
    return tuple(own.get(f, pod.get(f)) for f in IDENTITY_FIELDS)


def effective_identity(built: dict[str, list[dict[str, Any]]], build: str) -> tuple[Any, ...]:
    return effective_identity_of(pod_spec(built, build))


def test_a_container_level_user_overrides_the_pods(built: dict[str, list[dict[str, Any]]]) -> None:
    spec = copy.deepcopy(pod_spec(built, "prometheus-operator"))
    assert effective_identity_of(spec) == (0, 0, False)
    spec["containers"][0]["securityContext"]["runAsUser"] = 1000  # schema-valid, but not root
    assert effective_identity_of(spec) == (1000, 0, False)
    del spec["securityContext"]["runAsGroup"]
    assert effective_identity_of(spec) == (1000, None, False)


@pytest.mark.parametrize("build", BUILDS)
def test_security_context(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    pod = pod_spec(built, build)["securityContext"]
    ctr = container(built, build)["securityContext"]
    made_of = MADE_OF[build]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctr["readOnlyRootFilesystem"] is True
    # what the container runs as: a container's own runAsUser would override the pod's
    if "non-root" in made_of:
        assert effective_identity(built, build) == (65532, 65532, True)  # the image's USER (tests/test_image.py)
    else:
        assert effective_identity(built, build) == (0, 0, False), "uid 0 is needed for the kubelet socket"
    if "privileged" in made_of:
        assert ctr["privileged"] is True and ctr["allowPrivilegeEscalation"] is True and "capabilities" not in ctr
    else:
        assert "privileged" not in ctr
        assert ctr["allowPrivilegeEscalation"] is False
        assert ctr["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(built, build)["automountServiceAccountToken"] is False
    assert one(built, build, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod_spec(built, build)["enableServiceLinks"] is False, (
        "a Service's *_PORT variables (e.g. RESMON_EXPORTER_PORT) start with RESMON_: the "
        "exporter would log them as unknown settings")


@pytest.mark.parametrize("build", BUILDS)
def test_scheduling_and_environment(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    daemonset = one(built, build, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert spec["priorityClassName"] == "system-node-critical"
    env = {e["name"]: e for e in container(built, build)["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"]: e["values"] for term in terms for e in term["matchExpressions"]}
    tolerations = spec["tolerations"]
    if "amd" in MADE_OF[build]:
        assert keys == {"feature.node.kubernetes.io/pci-1002.present": ["true"]}
        assert tolerations == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                               {"key": "CriticalAddonsOnly", "operator": "Exists"}]
        assert not any(name.startswith("NVIDIA_") for name in env)
        assert "runtimeClassName" not in spec
        assert "--gpu.backend=amdgpu" in container(built, build)["args"]  # sysfs, no amd-smi in the image
    else:
        assert not any(a.startswith("--gpu.backend") for a in container(built, build)["args"])  # auto: NVML
        assert keys["feature.node.kubernetes.io/pci-10de.present"] == ["true"]
        assert keys["nvidia.com/gpu.present"] == ["true"]
        assert tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                               {"key": "CriticalAddonsOnly", "operator": "Exists"}]
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    if "nvidia-runtime-class" in MADE_OF[build]:
        assert spec["runtimeClassName"] == "nvidia"
    else:
        assert "runtimeClassName" not in spec  # not every cluster has the class


@pytest.mark.parametrize("build", BUILDS)
def test_gke_quota_admits_the_daemonsets_priority_class(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    quotas = objects(built, build, "ResourceQuota")
    if "gke" not in MADE_OF[build]:
        assert quotas == []  # only GKE gates the critical classes by quota
        return
    [quota] = quotas
    assert quota["metadata"]["name"] == "resmon-exporter-critical-pods"
    # GKE admits a critical pod only where a quota's scope names its class, in its namespace
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"operator": "In", "scopeName": "PriorityClass", "values": [pod_spec(built, build)["priorityClassName"]]}]
    assert quota["metadata"].get("namespace") == one(built, build, "DaemonSet")["metadata"].get("namespace")
    assert set(quota["spec"]["hard"]) == {"pods"}  # admits, limits nothing else
    assert quota["spec"]["hard"]["pods"] == "1G"  # as GKE's own gcp-critical-pods: never the limit


@pytest.mark.parametrize("build", BUILDS)
def test_probes_and_port(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    ctr = container(built, build)
    assert ctr["ports"] == [{"name": "metrics", "containerPort": 9636, "protocol": "TCP"}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}
    assert config(built, build).web_telemetry_path == "/metrics"


@pytest.mark.parametrize("build", BUILDS)
def test_process_attribution(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    spec = pod_spec(built, build)
    cfg = config(built, build)
    if "process-attribution" not in MADE_OF[build]:
        assert "hostPID" not in spec and cfg.collector_processes is False  # opt-in only
        return
    assert spec["hostPID"] is True
    assert cfg.collector_processes is True
    # each directory the exporter reads is the host's, mounted read-only where the flag points
    for path, host in (
        (cfg.path_procfs, "/proc"),
        (cfg.kubernetes_pod_logs_dir, "/var/log/pods"),
        (cfg.kubernetes_container_logs_dir, "/var/log/containers"),
    ):
        mount_path, mount, volume = host_mount_of(built, build, path)
        assert mount_path == path != host  # under /host, not over the container's own
        assert mount["readOnly"] is True
        assert volume["hostPath"] == {"path": host, "type": "Directory"}
    # the base's args and mounts are kept, not replaced
    assert cfg.kubernetes_pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert "/tmp" in mounts(built, build)


@pytest.mark.parametrize("build", BUILDS)
def test_service_and_selectors(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    daemonset = one(built, build, "DaemonSet")
    service = one(built, build, "Service")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance"}  # never the version
    assert selector.items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9636, "targetPort": "metrics", "protocol": "TCP"}]
    assert pod_spec(built, build)["serviceAccountName"] == one(built, build, "ServiceAccount")["metadata"]["name"]


def rule_groups() -> list[dict[str, Any]]:
    """The groups of every prometheus/rules/*.yml, file after file in name order."""
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]


def alert_job_patterns() -> set[str]:
    """The job regexes ResmonExporterDown/Absent select (job=~"...")."""
    patterns = set(re.findall(r'up\{job=~"([^"]+)"\}', RULES.read_text()))
    assert patterns
    return patterns


def check_monitor(built: dict[str, list[dict[str, Any]]], build: str, monitor: dict[str, Any], endpoint: dict[str, Any]) -> None:
    """What the ServiceMonitor and the PodMonitor share: the release label kube-prometheus-stack
    selects by (on the PrometheusRule too), and the endpoint's scrape."""
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(built, build, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert endpoint["honorLabels"] is True
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} in endpoint["relabelings"]


def test_the_job_name_matches_the_shipped_alerts(built: dict[str, list[dict[str, Any]]]) -> None:
    # a ServiceMonitor's job label is the Service's name
    patterns = alert_job_patterns()
    for pattern in patterns:
        assert re.fullmatch(pattern, one(built, "prometheus-operator", "Service")["metadata"]["name"])


@pytest.mark.parametrize("build", [b for b in BUILDS if "prometheus-operator" in MADE_OF[b]])
def test_servicemonitor(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    monitor = one(built, build, "ServiceMonitor")
    service = one(built, build, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    check_monitor(built, build, monitor, endpoint)
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert "namespaceSelector" not in monitor["spec"]  # the ServiceMonitor's own namespace
    assert not objects(built, build, "PodMonitor")  # one or the other, never both (double scrapes)


@pytest.mark.parametrize("build", [b for b in BUILDS if monitor_kind(b) == "PodMonitor"])
def test_podmonitor(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    monitor = one(built, build, "PodMonitor")
    pod = one(built, build, "DaemonSet")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    check_monitor(built, build, monitor, endpoint)
    assert endpoint["port"] in {p["name"] for p in container(built, build)["ports"]}
    assert endpoint["path"] == "/metrics"
    # the job label is the pods' app.kubernetes.io/name, which the shipped alerts select
    job = pod["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert all(re.fullmatch(p, job) for p in alert_job_patterns()), job
    assert not objects(built, build, "ServiceMonitor")  # one or the other, never both (double scrapes)


def test_the_combinations_keep_the_exclusions() -> None:
    # each exclusion is one docs/kubernetes.md states, every component is in some combination
    for name, components in COMBINATIONS.items():
        assert not any(pair <= set(components) for pair in EXCLUSIVE), name
    assert set(COMPONENTS) - {"gke"} <= {c for components in COMBINATIONS.values() for c in components} | {"amd", "non-root"}
    text = " ".join(DOCS.read_text().split())
    assert "`podmonitor` excludes `prometheus-operator`" in text


def test_kustomize_refuses_both_monitors(tmp_path: Path) -> None:
    overlays = user_tree(tmp_path)
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["../../base"],
            "components": [f"../../components/{c}" for c in MONITORS]}
    directory = write_kustomization(overlays / "both", yaml.safe_dump(body))
    done = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "already registered id" in done.stderr, done.stdout[:500] + done.stderr


def base_image() -> dict[str, str]:
    """The base's one `images:` entry: the image every build runs."""
    [entry] = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["images"]
    return entry


@pytest.mark.parametrize("build", BUILDS)
def test_labels_and_image_follow_the_version(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    for doc in built[build]:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "resmon-exporter"
        assert labels["app.kubernetes.io/version"] == __version__, f"{doc['kind']}: version label"
    assert one(built, build, "DaemonSet")["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == __version__
    entry = base_image()
    assert entry["newTag"] == __version__
    assert container(built, build)["image"] == f"{entry['newName']}:{entry['newTag']}"


def test_the_daemonset_names_the_image_the_entry_sets() -> None:
    # kustomize rewrites only an image whose name is the entry's: another name would be pulled as written
    daemonset = yaml.safe_load((K8S / "base" / "daemonset.yaml").read_text())
    [ctr] = daemonset["spec"]["template"]["spec"]["containers"]
    assert ctr["image"] == base_image()["name"]


def doc_image_commands() -> dict[str, set[str]]:
    """The images docs/kubernetes.md builds, pushes and sets, by command."""
    text = DOCS.read_text()
    found: dict[str, set[str]] = {}
    for command, pattern in {"docker build": r"docker build -t (\S+) \.", "podman build": r"podman build -t (\S+) \.",
                             "docker push": r"docker push (\S+)", "podman push": r"podman push (\S+)",
                             "set image": r"kustomize edit set image ([^=\s]+=\S+?)\)?$"}.items():
        found[command] = set(re.findall(pattern, text, re.M))
    return found


def test_the_docs_build_push_and_set_one_image(tmp_path: Path) -> None:
    found = doc_image_commands()
    assert all(found.values()), found
    [built_image] = found["docker build"]
    assert found["podman build"] == found["docker push"] == found["podman push"] == {built_image}
    [setting] = found["set image"]
    name, image = setting.split("=", 1)
    assert name == base_image()["name"] and image == built_image
    assert built_image.rsplit(":", 1)[1] == __version__ and built_image.rsplit(":", 1)[0].endswith("/resmon-exporter")
    # the Install section's first command sets it, before anything is applied
    install = DOCS.read_text().split("## Install", 1)[1]
    [first_block] = re.findall(r"```sh\n(.*?)```", install, re.S)[:1]
    assert "kustomize edit set image" in first_block.splitlines()[0]
    # what `kustomize edit set image` does to the base, then a build takes the built image
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree, symlinks=True)
    kustomization = tree / "base" / "kustomization.yaml"
    body = yaml.safe_load(kustomization.read_text())
    new_name, new_tag = image.rsplit(":", 1)
    body["images"] = [{"name": name, "newName": new_name, "newTag": new_tag}]
    kustomization.write_text(yaml.safe_dump(body))
    for overlay in ("kube-prometheus-stack", "podmonitor", "non-root"):
        out = {overlay: kustomize(kubectl(), tree / "overlays" / overlay)}
        assert container(out, overlay)["image"] == built_image, overlay


@pytest.mark.parametrize("build", BUILDS)
def test_namespace(built: dict[str, list[dict[str, Any]]], build: str) -> None:
    namespaces = {doc["metadata"].get("namespace") for doc in built[build]}
    assert namespaces == ({"monitoring"} if build == "kube-prometheus-stack" else {None})  # the base sets none


# -- the kustomizations docs/kubernetes.md shows ---------------------------------------------
def doc_snippets() -> dict[str, str]:
    """```yaml blocks that follow a `<!-- kustomization: NAME -->` line in docs/kubernetes.md."""
    pattern = re.compile(r"<!-- kustomization: ([\w-]+) -->\n```yaml\n(.*?)```", re.DOTALL)
    return dict(pattern.findall(DOCS.read_text()))


def test_the_documented_kustomizations_build_as_described(tmp_path: Path) -> None:
    snippets = doc_snippets()
    assert {"combined", "release", "image"} <= set(snippets), sorted(snippets)
    overlays = user_tree(tmp_path)
    binary = kubectl()
    out = {name: kustomize(binary, write_kustomization(overlays / name, text)) for name, text in snippets.items()}
    kinds = {doc["kind"] for doc in out["combined"]}
    assert {"DaemonSet", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    assert pod_spec(out, "combined")["hostPID"] is True
    assert {doc["metadata"].get("namespace") for doc in out["combined"]} == {"monitoring"}
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(out, "release", kind)["metadata"]["labels"]["release"] == "prom"
    assert container(out, "image")["image"] == f"registry.example.com/gpu/resmon-exporter:{__version__}"
    for docs in out.values():
        for doc in docs:
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                validate_cr(doc)
            else:
                kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


# -- the PromQL docs/kubernetes.md shows -----------------------------------------------------
def doc_promql() -> list[str]:
    """The expressions of the ```promql block: each starts after its top-level comment."""
    [block] = re.findall(r"```promql\n(.*?)```", DOCS.read_text(), re.DOTALL)
    exprs = []
    for chunk in block.strip().split("\n\n"):
        lines = chunk.splitlines()
        while lines and lines[0].startswith("#"):
            lines.pop(0)
        assert lines, chunk
        exprs.append("\n".join(lines))
    return exprs


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool missing: scripts/test.sh installs Debian's prometheus")
    return path


# a Deployment's pods (one listed by two kube-state-metrics replicas), a StatefulSet's, a bare
# ReplicaSet's: kube_pod_owner names the ReplicaSet, kube_replicaset_owner its Deployment
OWNER_SERIES = [
    'resmon_gpu_allocation_info{namespace="a",pod="web-7d9f-x1",uuid="g1"}',
    'resmon_gpu_allocation_info{namespace="a",pod="web-7d9f-x2",uuid="g2"}',
    'resmon_gpu_allocation_info{namespace="a",pod="train-0",uuid="g3"}',
    'resmon_gpu_allocation_info{namespace="a",pod="bare-r1",uuid="g4"}',
    *[f'kube_pod_owner{{namespace="a",pod="web-7d9f-x1",owner_kind="ReplicaSet",owner_name="web-7d9f",instance="{i}"}}'
      for i in ("ksm1", "ksm2")],
    'kube_pod_owner{namespace="a",pod="web-7d9f-x2",owner_kind="ReplicaSet",owner_name="web-7d9f",instance="ksm1"}',
    'kube_pod_owner{namespace="a",pod="train-0",owner_kind="StatefulSet",owner_name="train",instance="ksm1"}',
    'kube_pod_owner{namespace="a",pod="bare-r1",owner_kind="ReplicaSet",owner_name="bare",instance="ksm1"}',
    *[f'kube_replicaset_owner{{namespace="a",replicaset="web-7d9f",owner_kind="Deployment",owner_name="web",instance="{i}"}}'
      for i in ("ksm1", "ksm2")],
    'kube_replicaset_owner{namespace="a",replicaset="bare",owner_kind="<none>",owner_name="<none>",instance="ksm1"}',
]


def test_the_documented_promql_is_valid_and_counts_gpus_per_deployment(tmp_path: Path) -> None:
    binary = promtool()
    exprs = doc_promql()
    assert len(exprs) >= 5
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": [
        {"record": f"docs_expr_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}, sort_keys=False))
    done = subprocess.run([binary, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    tests = tmp_path / "tests.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": "1"} for s in OWNER_SERIES],
        "promql_expr_test": [{"expr": "docs_expr_0", "eval_time": "0m", "exp_samples": [
            {"labels": f'docs_expr_0{{namespace="a",owner_kind="{kind}",owner_name="{name}"}}', "value": count}
            for kind, name, count in (("Deployment", "web", 2), ("StatefulSet", "train", 1), ("ReplicaSet", "bare", 1))
        ]}],
    }]}, sort_keys=False))
    done = subprocess.run([binary, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
