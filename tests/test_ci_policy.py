"""tests/ci_policy.py and the e2e marker, proven on a throwaway suite run in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SKIPPING_SUITE = textwrap.dedent(
    """
    import sys
    import pytest

    def test_passes():
        assert True

    def test_skip_call():
        pytest.skip("header missing")

    @pytest.mark.skipif(True, reason="tool missing")
    def test_skipif_marker():
        pass

    def test_importorskip():
        pytest.importorskip("no_such_module_resmon")

    @pytest.fixture
    def needs_thing():
        pytest.skip("skipped in a fixture")

    def test_skip_in_fixture(needs_thing):
        pass

    def test_xfail_is_not_a_skip():
        pytest.xfail("known")
    """
)

MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module_resmon")\n\ndef test_never():\n    pass\n'


# scripts/test.sh runs the suites on pytest-xdist workers ("-p xdist -n 2": the plugin loads
# even where pytest's plugin autoloading is off): a worker's skip must fail the run as well
XDIST = ("-p", "xdist", "-n", "2")


def run_suite(tmp_path: Path, ci: str | None, *args: str) -> tuple[int, str]:
    (tmp_path / "test_suite.py").write_text(SKIPPING_SUITE)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's config
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(HERE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ci_policy", "-p", "no:cacheprovider", "-q", "-rA",
         "--continue-on-collection-errors", *args, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    return result.returncode, result.stdout + result.stderr


def counts(output: str) -> dict[str, int]:
    summary = output.strip().splitlines()[-1]
    return {word.rstrip("s"): int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}  # "errors" -> "error"


@pytest.mark.parametrize("workers", [(), XDIST], ids=["serial", "xdist"])
def test_without_ci_skips_stay_skips(tmp_path, workers):
    rc, out = run_suite(tmp_path, None, *workers)
    assert rc == 0, out
    assert counts(out) == {"passed": 1, "skipped": 5, "xfailed": 1}, out
    assert "forbids skips" not in out


@pytest.mark.parametrize(("value", "workers"), [("true", ()), ("1", ()), ("true", XDIST)],
                         ids=["true-serial", "1-serial", "true-xdist"])
def test_under_ci_every_skip_fails(tmp_path, value, workers):
    rc, out = run_suite(tmp_path, value, *workers)
    assert rc == 1, out
    # skips in the test body fail; skips in setup (skipif, a fixture) and at collection (the
    # module-level importorskip) are errors; the xfail is untouched. Any of them fails the run.
    assert counts(out) == {"failed": 2, "error": 3, "passed": 1, "xfailed": 1}, out
    assert "CI=true forbids skips, and this was skipped" in out
    for reason in ("header missing", "tool missing", "no_such_module_resmon", "skipped in a fixture"):
        assert reason in out, reason


def test_ci_false_is_not_ci(tmp_path):
    rc, out = run_suite(tmp_path, "false")
    assert rc == 0 and counts(out)["skipped"] == 5, out


def test_e2e_marker_follows_fixtures_and_tools():
    # classify test_stack.py's tests in a fresh collection (this session may have deselected e2e)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only", "-m", "e2e",
         str(HERE / "test_stack.py")], capture_output=True, text=True, timeout=120, cwd=HERE.parent)
    names = {line.split("::", 1)[1].split("[")[0] for line in result.stdout.splitlines() if "::" in line}
    # the live stack (fixture), promtool and docker-compose users are e2e; pure file checks are not
    assert {"test_every_dashboard_query_returns_data", "test_rules_check_clean",
            "test_promtool_rule_unit_tests_pass_and_cover_every_alert", "test_compose_file_is_valid_and_mounts_exist"} <= names, result.stdout
    assert not names & {"test_dashboard_structure", "test_rules_are_annotated", "test_generated_dashboards_are_committed"}


def test_every_process_collects_the_same_tests():
    # xdist workers each collect the suite and must agree on every test id, in order, or the
    # run stops at once ("Different tests were collected between gw0 and gw1"): an id may not
    # hold anything random (a bcrypt salt) or ordered by hash (a set under PYTHONHASHSEED)
    def collect(seed: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                                 str(HERE)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=HERE.parent)

    runs = [collect("1"), collect("2")]  # at once: each is a few seconds of imports
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    ids = [[line for line in out.splitlines() if "::" in line] for out in outputs]
    assert all(run.returncode == 0 for run in runs), outputs[0][-3000:]
    assert len(ids[0]) > 1000, outputs[0][-3000:]
    differ = [(a, b) for a, b in zip(*ids) if a != b]
    assert ids[0] == ids[1], f"{len(differ)} ids differ between two collections, first: {differ[:3]}"
