from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from fakenvml import Exporter, Scenario, Trace, build_fake, nvml_env


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories holding a libnvidia-ml.so.1: 'current' (a modern driver) and 'old'
    (a driver without the _v2/V/_v3/EventReasons symbols)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the fake libnvidia-ml.so.1 (scripts/test.sh installs it)")
    root = tmp_path_factory.mktemp("fake-nvml")
    return {
        "current": build_fake(root / "current"),
        "old": build_fake(root / "old", old_driver=True),
    }


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path / "scenario.txt")


@pytest.fixture
def trace(tmp_path: Path) -> Trace:
    return Trace(tmp_path / "trace.txt")


@pytest.fixture
def run_exporter(fake_libs: dict[str, Path], scenario: Scenario, trace: Trace) -> Iterator[Callable[..., Exporter]]:
    """run_exporter(*flags, lib="current"|"old"|Path|None, env={...}) -> a listening Exporter."""
    started: list[Exporter] = []

    def start(*args: str, lib: Any = "current", env: dict[str, str] | None = None, wait: bool = True) -> Exporter:
        lib_dir = fake_libs[lib] if isinstance(lib, str) else lib
        full_env = nvml_env(lib_dir, scenario, trace)
        full_env.update(env or {})
        exporter = Exporter(args, full_env)
        started.append(exporter)
        return exporter.wait_listening() if wait else exporter

    yield start
    for exporter in started:
        exporter.stop()
