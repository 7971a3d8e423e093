"""pytest plugin: no silent skips in CI.

With CI=true (what CI services and .ci/run set), a test that would be skipped (pytest.skip,
a skipif marker, pytest.importorskip, a missing tool or header) is reported as FAILED, so a
CI run cannot pass while quietly not testing something. Without CI the skip stays a skip
(a developer's laptop may lack nvidia-nvml-dev). xfail is left alone: it is not a skip.

tests/conftest.py imports these hooks; tests/test_ci_policy.py proves them on a temp suite.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_reason(longrepr: Any) -> str:
    # a skip's longrepr is (path, lineno, "Skipped: reason")
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return f"{longrepr[0]}:{longrepr[1]}: {longrepr[2]}"
    return str(longrepr)


def _fail_skip(report: Any) -> None:
    report.outcome = "failed"
    report.longrepr = f"CI=true forbids skips, and this was skipped: {_skip_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    # a module-level pytest.importorskip / pytest.skip(allow_module_level=True) skips at collection
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped:
        _fail_skip(report)
