"""Flag and environment precedence, bounded values, and start-up calls that cannot hang."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from resmon_exporter.cli import UsageError, parse_config
from fakenvml import REPO, nvml_env
from scenarios import three_gpus


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    full_env = nvml_env(None, None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "resmon_exporter", *args], env=full_env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def one_line_exit_2(result: subprocess.CompletedProcess, needle: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("resmon-exporter: error:") and needle in lines[0], lines[0]


def test_a_flag_overrides_a_bad_environment_value():
    config, _ = parse_config(["--collect.timeout=2s"], {"RESMON_COLLECT_TIMEOUT": "soon"})
    assert config.collect_timeout == 2.0
    with pytest.raises(UsageError, match="RESMON_COLLECT_TIMEOUT: invalid duration 'soon'"):
        parse_config([], {"RESMON_COLLECT_TIMEOUT": "soon"})  # not overridden: still an error


def test_help_and_version_work_whatever_the_environment_holds():
    env = {"RESMON_COLLECT_TIMEOUT": "soon", "RESMON_WEB_MAX_REQUESTS": "many"}
    help_run = run_cli("--help", env=env)
    assert help_run.returncode == 0 and "--collect.timeout" in help_run.stdout, help_run.stderr
    assert run_cli("--version", env=env).returncode == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--collect.timeout=1e10"], "at most 10m"),
        (["--collect.timeout=11m"], "at most 10m"),
        (["--collect.cache-ttl=2h"], "at most 1h"),
        (["--web.idle-timeout=1e300"], "at most 1h"),
        (["--web.read-header-timeout=inf"], "invalid duration"),
        (["--web.timeout-offset=2m"], "at most 1m"),
        (["--web.telemetry-path=/métrics"], "printable ASCII"),
        (["--web.telemetry-path=/metric%73"], "without %"),
        (["--web.telemetry-path=/a#b"], "invalid telemetry path"),
        (["--collector.processes.max-per-gpu=0"], "1 or more"),
        (["--collector.processes.max-per-gpu=-1"], "1 or more"),
        (["--collector.processes.max-per-gpu=\u00b2"], "1 or more"),
        (["--collector.processes.group-by=pod"], "choose from process, container"),
        (["--kubernetes.cache-ttl=soon"], "invalid duration"),
        (["--kubernetes.pod-resources-socket=/a,b.sock"], "comma"),
        (["--collector.processes", "--path.procfs=/nonexistent"], "not a procfs mount"),
    ],
)
def test_out_of_range_values_are_one_line_and_exit_2(args, needle):
    one_line_exit_2(run_cli(*args), needle)


def test_bounds_are_inclusive():
    config, _ = parse_config(["--collect.timeout=10m", "--collect.cache-ttl=1h", "--web.timeout-offset=1m"], {})
    assert (config.collect_timeout, config.collect_cache_ttl, config.web_timeout_offset) == (600.0, 3600.0, 60.0)


def test_explicit_nvml_whose_init_hangs_is_a_bounded_startup_error(fake_libs, scenario, tmp_path):
    scenario.write({**three_gpus(), "delay_ms.nvmlInitWithFlags": 60000})
    env = nvml_env(fake_libs["current"], scenario)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "resmon_exporter", "--gpu.backend=nvml", "--collect.timeout=1s", "--web.listen-address=127.0.0.1:0"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert time.monotonic() - started < 20  # the init hangs for 60 s; the bound is --collect.timeout
    one_line_exit_2(result, "nvmlInit did not return within 1s")


def test_the_flags_doc_lists_every_flag_with_its_environment_variable():
    from resmon_exporter.cli import FLAGS

    flags_doc = (REPO / "docs" / "flags.md").read_text()  # the table moved there from the README
    for flag in FLAGS:
        spelled = f"`--[no-]{flag.name}`" if flag.boolean else f"`--{flag.name}`"
        assert f"| {spelled} | `{flag.env}` |" in flags_doc, flag.name


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--collector.processes=true"], True),
        (["--collector.processes=TRUE"], True),
        (["--collector.processes=false"], False),
        (["--collector.host=False"], False),
        (["--collector.host"], True),
        (["--no-collector.host"], False),
        (["--collector.xid=false", "--collector.xid"], True),  # the last one wins
    ],
)
def test_boolean_flags_take_true_or_false_after_an_equals_sign(args, expected):
    config, _ = parse_config(args, {})
    dest = args[-1].lstrip("-").removeprefix("no-").split("=")[0].replace(".", "_").replace("-", "_")
    assert getattr(config, dest) is expected


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--collector.processes=maybe"], "invalid boolean 'maybe' (use true or false)"),
        (["--collector.processes=1"], "invalid boolean '1'"),
        (["--collector.processes="], "invalid boolean ''"),
        (["--no-collector.host=true"], "--no-collector.host takes no value"),
    ],
)
def test_a_bad_boolean_flag_value_is_one_line_and_exit_2(args, needle):
    one_line_exit_2(run_cli(*args), needle)


def test_a_boolean_flag_answers_through_the_real_cli():
    # the real entry point, not only parse_config: the value reaches the running exporter
    result = run_cli("--collector.processes=true", "--path.procfs=/nonexistent")
    one_line_exit_2(result, "not a procfs mount")  # processes is on, so the procfs check ran


def test_help_says_whether_each_collector_is_on_by_default():
    # issue 35 item 5: --help showed a default for every flag but the --[no-]collector.X
    # switches, so nobody could tell from it that processes is off and the others on
    from resmon_exporter.config import COLLECTORS

    result = run_cli("--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps help lines
    assert {c.default for c in COLLECTORS} == {True, False}, "both cases are checked"
    for spec in COLLECTORS:
        invocation = f"--collector.{spec.name}[=true|false], --no-collector.{spec.name} "
        start = text.index(invocation) + len(invocation)
        entry = text[start:text.index(" --", start)]  # up to the next flag
        expected = "(default on)" if spec.default else "(default off)"
        assert expected in entry, (spec.name, entry)
