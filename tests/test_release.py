"""The release pipeline, checked offline: .github/workflows/*.yml pass actionlint and zizmor (both
from PyPI wheels that carry their binaries; each is also shown a broken workflow, so a check
that cannot fail fails here), the release workflow does what docs/release.md says, and every
place that names the version agrees with exporter/version.py: pyproject.toml, the chart's
version and appVersion, the image tags in the docs and manifests, the manifests' version labels.

Runs once, in scripts/test.sh's first stage (the e2e marker): the tools' verdicts do not depend
on the Python version, and zizmor's wheel needs Python 3.11.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from resmon_exporter.version import __version__

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
CHART = Path("deploy/helm/resmon-exporter")
K8S = Path("deploy/kubernetes")
IMAGE = "ghcr.io/resmon-exporter/resmon-exporter"


def tool(name: str) -> str:
    """A console script of the test extra: beside this Python first (a venv not on PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        # a skip, which CI=true turns into a failure (tests/ci_policy.py)
        pytest.skip(f"{name} missing: pip install -e '.[test]'")
    return found


def workflow_files(directory: Path) -> list[str]:
    files = sorted(str(p) for p in directory.glob("*.yml"))
    assert files, f"no workflows under {directory}"
    return files


def actionlint(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("actionlint"), "-no-color", *workflow_files(directory)],
                          capture_output=True, text=True, timeout=120)


def zizmor(directory: Path) -> subprocess.CompletedProcess[str]:
    # --offline: no GitHub API (no network here); the pedantic persona: the strictest audits
    return subprocess.run([tool("zizmor"), "--offline", "--no-progress", "--persona", "pedantic", str(directory)],
                          capture_output=True, text=True, timeout=120)


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    directory = tmp_path / ".github" / "workflows"
    directory.mkdir(parents=True)
    text = RELEASE.read_text()
    assert old in text, old
    (directory / RELEASE.name).write_text(text.replace(old, new, 1))
    return directory


# -- the linters -----------------------------------------------------------------------------
def test_actionlint_passes() -> None:
    done = actionlint(WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_can_fail(tmp_path: Path) -> None:
    done = actionlint(broken_copy(tmp_path, "runs-on: ubuntu-24.04", "runs_on: ubuntu-24.04"))
    assert done.returncode == 1 and "runs_on" in done.stdout, done.stdout + done.stderr


def test_zizmor_passes() -> None:
    done = zizmor(WORKFLOWS)
    assert done.returncode == 0 and "No findings" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("old, new, audit", [
    # an action by tag, not by commit: whoever moves the tag runs code in the release
    ("actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1", "actions/checkout@v7.0.1", "unpinned-uses"),
    # the tag name straight into a shell script: template injection
    ('if [ "v$version" != "$TAG" ]', 'if [ "v$version" != "${{ github.ref_name }}" ]', "template-injection"),
])
def test_zizmor_can_fail(tmp_path: Path, old: str, new: str, audit: str) -> None:
    done = zizmor(broken_copy(tmp_path, old, new))
    assert done.returncode != 0 and audit in done.stdout, done.stdout + done.stderr


# -- what the release workflow does ------------------------------------------------------------
def release() -> dict[str, Any]:
    return yaml.safe_load(RELEASE.read_text())


def steps_text(job: dict[str, Any]) -> str:
    return "\n".join(str(step.get("uses", "")) + "\n" + str(step.get("run", "")) + "\n" + str(step.get("with", ""))
                     for step in job["steps"])


def test_the_release_workflow_runs_on_a_version_tag_with_least_permissions() -> None:
    flow = release()
    trigger = flow[True]  # YAML 1.1 reads the key `on` as true
    assert set(trigger) == {"push"} and trigger["push"] == {"tags": ["v[0-9]+.[0-9]+.[0-9]+*"]}
    assert flow["permissions"] == {}
    writes = {name: {k for k, v in job.get("permissions", {}).items() if v == "write"}
              for name, job in flow["jobs"].items()}
    assert writes == {"test": set(), "dist": set(), "pypi": {"id-token"}, "image": {"packages", "id-token"},
                      "chart": {"packages"}}


def test_the_release_workflow_publishes_what_docs_release_md_says() -> None:
    jobs = release()["jobs"]
    assert "bash .ci/run" in steps_text(jobs["test"])
    assert {"dist": "test", "pypi": "dist", "image": "test"} == {j: jobs[j]["needs"] for j in ("dist", "pypi", "image")}
    assert set(jobs["chart"]["needs"]) == {"test", "image"}
    dist = steps_text(jobs["dist"])
    assert "python -m build" in dist and "twine check --strict dist/*" in dist
    assert "pypa/gh-action-pypi-publish@" in steps_text(jobs["pypi"]) and jobs["pypi"]["environment"]["name"] == "pypi"
    [build] = [s for s in jobs["image"]["steps"] if "docker/build-push-action@" in s.get("uses", "")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64" and build["with"]["push"] is True
    assert build["with"]["sbom"] is True
    assert release()["env"]["IMAGE"] == IMAGE
    assert 'cosign sign --yes "${IMAGE}@${DIGEST}"' in steps_text(jobs["image"])
    chart = steps_text(jobs["chart"])
    assert "helm_binary.py" in chart and '"$helm" push' in chart and release()["env"]["CHARTS"].startswith("oci://")
    for job in jobs.values():
        for step in job["steps"]:
            if "actions/checkout@" in step.get("uses", ""):
                assert step["with"]["persist-credentials"] is False  # no token left in .git/config


# -- one version everywhere --------------------------------------------------------------------
def version_disagreements(root: Path) -> list[str]:
    """Every place under root that names the project's version or image and disagrees with
    exporter/version.py, one line each (empty: they agree)."""
    match = re.search(r'^__version__ = "([^"]+)"$', (root / "exporter" / "version.py").read_text(), re.M)
    assert match, "no __version__ in exporter/version.py"
    version = match.group(1)
    found: list[str] = []

    def expect(where: str, got: Any, want: Any) -> None:
        if got != want:
            found.append(f"{where}: {got!r}, not {want!r}")

    pyproject = (root / "pyproject.toml").read_text()
    expect("pyproject.toml: the version's source",
           re.search(r"^version = \{ attr = \"([^\"]+)\" \}$", pyproject, re.M) is not None
           and 'attr = "resmon_exporter.version.__version__"' in pyproject, True)
    chart = yaml.safe_load((root / CHART / "Chart.yaml").read_text())
    expect(f"{CHART}/Chart.yaml version", chart["version"], version)
    expect(f"{CHART}/Chart.yaml appVersion", chart["appVersion"], version)
    values = yaml.safe_load((root / CHART / "values.yaml").read_text())
    expect(f"{CHART}/values.yaml image.repository", values["image"]["repository"], IMAGE)
    expect(f"{CHART}/values.yaml image.tag (empty: appVersion)", values["image"]["tag"], "")
    [entry] = yaml.safe_load((root / K8S / "base" / "kustomization.yaml").read_text())["images"]
    expect(f"{K8S}/base/kustomization.yaml newName", entry["newName"], IMAGE)
    expect(f"{K8S}/base/kustomization.yaml newTag", entry["newTag"], version)
    expect(".github/workflows/release.yml env.IMAGE", yaml.safe_load((root / ".github/workflows/release.yml")
                                                                     .read_text())["env"]["IMAGE"], IMAGE)
    for path in sorted((root / K8S).rglob("*.yaml")):
        for label in re.findall(r"app\.kubernetes\.io/version: \"?([^\"\s]+)", path.read_text()):
            expect(f"{path.relative_to(root)}: app.kubernetes.io/version", label, version)
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "deploy").rglob("*.md")),
             *sorted((root / "deploy").rglob("*.yaml"))]
    patterns = (r"/resmon-exporter:(\d[\w.+-]*\w)",        # an image reference with its tag
                r"resmon-exporter --version (\d[\w.+-]*\w)",  # helm install from the registry
                r"resmon-exporter-(\d[\w.+-]*\w)\.tgz",    # a packaged chart
                r"newTag: \"?(\d[\w.+-]*\w)")                 # a kustomize images: entry
    for path in texts:
        if path.is_file():
            for pattern in patterns:
                for tag in re.findall(pattern, path.read_text()):
                    expect(f"{path.relative_to(root)}: {pattern.split('(')[0]}", tag, version)
    return found


def test_every_version_agrees() -> None:
    assert version_disagreements(REPO) == []
    assert __version__ in (REPO / CHART / "Chart.yaml").read_text()


def copy_of_the_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for rel in ("exporter/version.py", "pyproject.toml", "README.md", ".github/workflows/release.yml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copytree(REPO / "deploy", root / "deploy", symlinks=True)
    assert version_disagreements(root) == []  # the control
    return root


@pytest.mark.parametrize("rel, old, new, expected", [
    (f"{CHART}/Chart.yaml", f'appVersion: "{__version__}"', 'appVersion: "9.9.9"', "Chart.yaml appVersion: '9.9.9'"),
    (f"{CHART}/Chart.yaml", f"version: {__version__}", "version: 9.9.9", "Chart.yaml version: '9.9.9'"),
    ("docs/kubernetes.md", f"resmon-exporter:{__version__}", "resmon-exporter:9.9.9", "docs/kubernetes.md"),
    (f"{K8S}/base/kustomization.yaml", f'newTag: "{__version__}"', 'newTag: "9.9.9"', "newTag: '9.9.9'"),
    (f"{K8S}/base/daemonset.yaml", f'app.kubernetes.io/version: "{__version__}"', 'app.kubernetes.io/version: "9.9.9"',
     "daemonset.yaml: app.kubernetes.io/version: '9.9.9'"),
    ("exporter/version.py", f'"{__version__}"', '"9.9.9"', f"Chart.yaml version: '{__version__}', not '9.9.9'"),
])
def test_a_version_mismatch_is_found(tmp_path: Path, rel: str, old: str, new: str, expected: str) -> None:
    root = copy_of_the_repo(tmp_path)
    path = root / rel
    text = path.read_text()
    assert old in text, (rel, old)
    path.write_text(text.replace(old, new, 1))
    found = version_disagreements(root)
    assert any(expected in line for line in found), found
