"""The systemd unit and its environment file (deploy/systemd/), checked with Debian's
systemd-analyze: `verify` (syntax, directives, the executable) and `security --offline`
(the hardening's exposure score), and the environment file against the CLI's own parser."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resmon_exporter.cli import FLAGS, parse_config

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "systemd" / "resmon-exporter.service"
ENV_FILE = REPO / "deploy" / "systemd" / "resmon-exporter.env"
SHIPPED_EXEC = "/opt/resmon-exporter/bin/resmon-exporter"  # where README's install steps put it
MAX_EXPOSURE = 2.0  # systemd-analyze's scale: 0 (locked down) .. 10 (exposed); "OK" is under 4


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze missing: scripts/test.sh installs Debian's systemd package")
    return path


def installed_unit(tmp_path: Path, text: str | None = None) -> Path:
    """The unit as shipped, but with ExecStart pointing at this venv's resmon-exporter:
    verify insists that the executable exists, and this machine has no /opt install."""
    text = UNIT.read_text() if text is None else text
    exe = Path(sys.executable).parent / "resmon-exporter"
    assert exe.is_file(), exe
    lines = [f"ExecStart={exe}" if line == f"ExecStart={SHIPPED_EXEC}" else line for line in text.splitlines()]
    path = tmp_path / "resmon-exporter.service"
    path.write_text("\n".join(lines) + "\n")
    return path


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if (m := re.match(r"^([A-Za-z]+)=(.*)$", line)):
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


def exposure(unit: Path) -> float:
    out = subprocess.run([systemd_analyze(), "security", "--offline=yes", str(unit)],
                         capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out)
    assert match, out
    return float(match.group(1))


def test_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    got = verify(installed_unit(tmp_path))
    # verify exits 0 on unknown keys and bad values too (it only warns): any output is a defect
    assert (got.returncode, got.stdout + got.stderr) == (0, "")


@pytest.mark.parametrize("typo", [("ProtectSystem=strict", "ProtectSytem=strict"),
                                  ("ProtectSystem=strict", "ProtectSystem=stric"),
                                  ("Restart=on-failure", "Restart=sometimes")])
def test_verify_catches_a_broken_unit(tmp_path: Path, typo: tuple[str, str]) -> None:
    got = verify(installed_unit(tmp_path, UNIT.read_text().replace(*typo)))
    assert got.stdout + got.stderr != ""


def test_unit_runs_the_installed_exporter_as_a_dedicated_user_with_the_environment_file() -> None:
    found = directives(UNIT.read_text())
    assert found["ExecStart"] == [SHIPPED_EXEC]  # no flags: settings come from the environment file
    assert found["User"] == ["resmon"] and found["Group"] == ["resmon"]
    assert found["EnvironmentFile"] == ["-/etc/default/resmon-exporter"]
    assert found["Restart"] == ["on-failure"]
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "CapabilityBoundingSet": ""}.items():
        assert found[key] == [value], key
    # these would take the GPUs (PrivateDevices) or the other users' processes (ProtectProc) away
    assert "PrivateDevices" not in found and "ProtectProc" not in found
    # the NVIDIA persistence daemon, where there is one, first; ordering only (no Wants/Requires)
    assert "nvidia-persistenced.service" in " ".join(found["After"])
    assert not any("nvidia" in v for key in ("Wants", "Requires", "BindsTo") for v in found.get(key, []))
    # the exporter drains in-flight scrapes within 8 s of SIGTERM: systemd must wait longer
    assert found["TimeoutStopSec"] == ["15s"]


# Directives that put the unit on a device allow-list (systemd.exec(5), systemd.resource-control(5)):
# PrivateDevices= sets DevicePolicy=closed; ProtectClock= implies DeviceAllow=char-rtc r, and
# before systemd 252 (PR #25075) unconditionally, so on Ubuntu 22.04 (249) or Debian 11 (247)
# DevicePolicy=auto plus that one entry blocks /dev/nvidiactl and /dev/nvidia0: NVML fails.
# (ProtectKernelLogs= hides /dev/kmsg by a mount, not by a device ACL, so it may stay.)
DEVICE_ALLOW_LIST_DIRECTIVES = ("PrivateDevices", "ProtectClock", "DeviceAllow", "DevicePolicy")


def test_no_directive_puts_the_gpus_behind_a_device_allow_list() -> None:
    found = directives(UNIT.read_text())
    closing = sorted(key for key in found if key in DEVICE_ALLOW_LIST_DIRECTIVES)
    assert closing == [], f"{closing}: on systemd < 252 these block /dev/nvidia* (NVML cannot start)"


def test_hardening_keeps_the_exposure_score_low(tmp_path: Path) -> None:
    assert exposure(installed_unit(tmp_path)) <= MAX_EXPOSURE
    # and the score can fail: the same unit without its [Service] hardening scores high
    bare = "\n".join(line for line in UNIT.read_text().splitlines()
                     if not re.match(r"^(No|Protect|Private|Restrict|Lock|SystemCall|Capability|Ambient|UMask|Remove)", line))
    (tmp_path / "bare").mkdir()
    assert exposure(installed_unit(tmp_path / "bare", bare)) > 5


def env_lines(uncomment: bool) -> dict[str, str]:
    """The file's RESMON_ settings; with uncomment, the commented examples too."""
    values: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line[1:] if uncomment and line.startswith("#RESMON_") else line
        if line.startswith("RESMON_"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


@pytest.mark.parametrize("uncomment", [False, True], ids=["as-shipped", "examples-enabled"])
def test_environment_file_is_what_the_cli_accepts(uncomment: bool) -> None:
    env = env_lines(uncomment)
    assert env and set(env) <= {flag.env for flag in FLAGS}
    config, warnings = parse_config([], environ=env)
    assert warnings == []
    assert config.web_listen_address == ":9636"
    if uncomment:
        assert config.collector_processes is True and config.web_config_file.endswith("web-config.yml")


def test_readme_install_steps_match_the_shipped_files() -> None:
    readme = (REPO / "README.md").read_text()
    assert "install -m 0644 deploy/systemd/resmon-exporter.service /etc/systemd/system/\n" in readme
    assert "install -m 0644 deploy/systemd/resmon-exporter.env /etc/default/resmon-exporter\n" in readme
    assert f"python3 -m venv {Path(SHIPPED_EXEC).parent.parent}" in readme
    assert "useradd --system" in readme and " resmon" in readme
