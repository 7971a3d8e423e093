"""What pip installs: the exporter/ folder as resmon_exporter, and the source distribution.

A top-level `exporter` in site-packages was shadowed by any user's own exporter.py (then
`python -m exporter` silently ran the user's file) and collided with other distributions.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXPORTER = REPO / "exporter"


def _build(kind: str, tmp_path: Path, folders: tuple[str, ...]) -> Path:
    """The sdist or wheel setuptools builds from a copy of the project's files and these folders."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(REPO / name, source / name)
    for name in folders:
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so*", "build"))
    build = f"import sys; from setuptools import build_meta; print(build_meta.build_{kind}(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp_path / "dist" / result.stdout.strip().splitlines()[-1]


def _listed_packages() -> list[str]:
    # a regex, not tomllib: the fast tests run on Python 3.10 too
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[\n(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml lists the packages under [tool.setuptools]"
    return re.findall(r'"([^"]+)"', block.group(1))


def test_pyproject_lists_every_package_of_the_folder() -> None:
    folders = sorted(
        ".".join(["resmon_exporter", *d.relative_to(EXPORTER).parts])
        for d in [EXPORTER, *EXPORTER.rglob("*")]
        if d.is_dir() and (d / "__init__.py").exists()
    )
    assert len(folders) >= 7  # the walk found the layers (collectors, backends, http, ...)
    assert _listed_packages() == folders  # sorted, none missing (it would not be installed), none extra
    assert 'package-dir = { "resmon_exporter" = "exporter" }' in (REPO / "pyproject.toml").read_text()


@pytest.mark.e2e
def test_the_wheel_holds_resmon_exporter_and_its_entry_point(tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path, ("exporter",))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    modules = {"resmon_exporter/" + str(p.relative_to(EXPORTER)) for p in EXPORTER.rglob("*.py")}
    assert modules <= names, sorted(modules - names)[:5]
    assert not any(n.startswith("exporter/") for n in names), sorted(n for n in names if n.startswith("exporter/"))[:5]
    assert "resmon-exporter = resmon_exporter.cli:main" in entry_points


@pytest.mark.e2e
def test_a_users_exporter_py_does_not_shadow_the_package(tmp_path: Path) -> None:
    (tmp_path / "exporter.py").write_text("print('the user file ran')\n")
    (tmp_path / "resmon.py").write_text("from resmon_exporter import ResourceMonitor, __version__\nprint(__version__)\n")
    version = subprocess.run([sys.executable, "-m", "resmon_exporter", "--version"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("resmon-exporter ") and "user file" not in version.stdout
    api = subprocess.run([sys.executable, "resmon.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert api.returncode == 0 and "user file" not in api.stdout, (api.stdout, api.stderr)


def test_sdist_has_the_package_license_and_metadata_and_no_tests(tmp_path: Path) -> None:
    # the tests need the whole repository (the fake NVML's C sources, deploy/, prometheus/,
    # a compiler): a source distribution with half of tests/ would only fail, so it has none
    archive = _build("sdist", tmp_path, ("exporter", "tests"))
    with tarfile.open(archive) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
        info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    assert not any(m.startswith("tests/") for m in members), sorted(m for m in members if m.startswith("tests/"))[:5]
    modules = {str(p.relative_to(REPO)) for p in EXPORTER.rglob("*.py")}
    assert modules <= members, modules - members
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members
    assert "License-Expression: Apache-2.0" in info
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License\n") and "END OF TERMS AND CONDITIONS" in (REPO / "LICENSE").read_text()
    urls = dict(line.split(": ", 1)[1].split(", ", 1) for line in info.splitlines() if line.startswith("Project-URL: "))
    unit = (REPO / "deploy" / "systemd" / "resmon-exporter.service").read_text()
    home = re.search(r"^Documentation=(\S+?)(?:#readme)?$", unit, re.M).group(1)  # the unit names the project's home
    assert urls.get("Homepage") == home and {"Documentation", "Issues", "Source"} <= set(urls), urls
    assert "Classifier: Programming Language :: Python :: 3.10" in info and "Classifier: Topic :: System :: Monitoring" in info
