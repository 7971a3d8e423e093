"""The installed import name: the exporter/ folder installs as resmon_exporter.

A top-level `exporter` in site-packages was shadowed by any user's own exporter.py (then
`python -m exporter` silently ran the user's file) and collided with other distributions.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXPORTER = REPO / "exporter"


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
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(EXPORTER, source / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = tmp_path / "dist" / result.stdout.strip().splitlines()[-1]
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
