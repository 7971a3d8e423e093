from __future__ import annotations

import inspect
import logging
import shutil
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

# no silent skips under CI=true (tests/ci_policy.py): pytest picks the hooks up from here
from ci_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from fakenvml import Exporter, Records, Scenario, Trace, build_fake, nvml_env

# -- the e2e marker ---------------------------------------------------------------------
# e2e: a test that starts the exporter as a subprocess or drives Prometheus' tools. The
# others (unit-level, in-process, the fake NVML rig) are "fast": scripts/test.sh runs them
# with -m "not e2e" on the lowest and highest supported Python as well.
# A test is e2e when its function, or any fixture it uses (transitively), refers to one of
# E2E_NAMES or passes one of E2E_TOOLS as a string. Nobody has to remember the marker;
# @pytest.mark.e2e by hand still works.
E2E_NAMES = frozenset({"Exporter", "Stack", "Fleet", "run_exporter"})
E2E_TOOLS = frozenset({"promtool", "prometheus-alertmanager", "amtool", "docker-compose"})  # the Prometheus server: Stack
# files whose tests start exporters some other way: the benchmark's quick mode starts its own
E2E_FILES = frozenset({"test_benchmarks.py"})


def _refers_to_e2e(code: types.CodeType) -> bool:
    if E2E_NAMES & set(code.co_names) or E2E_NAMES & set(code.co_freevars):
        return True
    for const in code.co_consts:
        if isinstance(const, str) and const in E2E_TOOLS:
            return True
        if isinstance(const, types.CodeType) and _refers_to_e2e(const):  # nested functions
            return True
    return False


def _is_e2e(item: pytest.Item) -> bool:
    if item.get_closest_marker("e2e") or item.path.name in E2E_FILES:
        return True
    if "run_exporter" in getattr(item, "fixturenames", ()):
        return True
    functions = [getattr(item, "function", None)]
    fixtureinfo = getattr(item, "_fixtureinfo", None)  # the fixtures of the closure, with their definitions
    if fixtureinfo is not None:
        functions += [d.func for defs in fixtureinfo.name2fixturedefs.values() for d in defs]
    codes = [getattr(inspect.unwrap(f), "__code__", None) for f in functions if f is not None]
    return any(_refers_to_e2e(c) for c in codes if c is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: starts exporter subprocesses or Prometheus tools (set by conftest)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)


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
    """run_exporter(*flags, lib="current"|"old"|Path|None, env={...}) -> a listening Exporter
    whose first GPU read is done (/-/ready 200: before it, scrapes carry no GPU families);
    ready=False returns as soon as it listens, wait=False at once."""
    started: list[Exporter] = []

    def start(
        *args: str, lib: Any = "current", env: dict[str, str] | None = None, wait: bool = True, ready: bool = True
    ) -> Exporter:
        lib_dir = fake_libs[lib] if isinstance(lib, str) else lib
        full_env = nvml_env(lib_dir, scenario, trace)
        full_env.update(env or {})
        exporter = Exporter(args, full_env)
        started.append(exporter)
        if not wait:
            return exporter
        exporter.wait_listening()
        if ready:
            exporter.wait_ready()
        return exporter

    yield start
    for exporter in started:
        exporter.stop()


@pytest.fixture
def log(request: pytest.FixtureRequest) -> tuple[logging.Logger, Records]:
    """A logger of its own for an in-process test, keeping every record (Records)."""
    logger = logging.getLogger(f"test.{request.node.name}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    records = Records()
    logger.handlers[:] = [records]
    return logger, records


@pytest.fixture
def workloads() -> Iterator[Any]:
    """Real child processes with chosen names (tests/workloads.py), killed at the end."""
    import tempfile

    from workloads import Workloads

    root = Path(tempfile.mkdtemp(prefix="resmon-wl-"))  # not tmp_path: another uid must be able to run them
    w = Workloads(root)
    yield w
    w.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kubelet() -> Iterator[Any]:
    """A real gRPC kubelet (tests/fake_kubelet.py) at a short socket path, not yet started;
    stopped at the end."""
    import os

    from fake_kubelet import FakeKubelet, short_socket_dir

    directory = short_socket_dir()
    k = FakeKubelet(os.path.join(directory, "kubelet.sock"))
    yield k
    k.stop()
    shutil.rmtree(directory, ignore_errors=True)
