"""The CLI's flags, environment variables and errors, and the HTTP routes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fakenvml import REPO, Exporter, nvml_env
from scenarios import three_gpus


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    full_env = nvml_env(None, None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "resmon_exporter", *args], env=full_env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (["--collect.timeout=soon"], {}, "invalid duration 'soon'"),
        (["--collect.timeout=0"], {}, "must be more than zero"),
        (["--collect.cache-ttl=-1s"], {}, "invalid duration"),
        (["--gpu.backend=cuda"], {}, "invalid choice 'cuda'"),
        (["--log.level=verbose"], {}, "invalid choice 'verbose'"),
        (["--web.listen-address=9636"], {}, "want host:port"),
        (["--web.listen-address=:99999"], {}, "port must be a number"),
        (["--web.telemetry-path=metrics"], {}, "must start with /"),
        (["--web.telemetry-path=/-/ready"], {}, "invalid telemetry path"),
        (["--web.max-requests=-1"], {}, "invalid number '-1'"),
        (["--web.read-header-timeout=0"], {}, "must be more than zero"),
        (["--web.idle-timeout=forever"], {}, "invalid duration 'forever'"),
        ([], {"RESMON_WEB_MAX_REQUESTS": "many"}, "RESMON_WEB_MAX_REQUESTS: invalid number 'many'"),
        ([], {"RESMON_COLLECT_TIMEOUT": "abc"}, "RESMON_COLLECT_TIMEOUT: invalid duration 'abc'"),
        ([], {"RESMON_COLLECTOR_GPU": "maybe"}, "RESMON_COLLECTOR_GPU: invalid boolean 'maybe'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, env, needle):
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert lines[0].startswith("resmon-exporter: error:")
    assert "Traceback" not in result.stderr


def test_version_and_help():
    version = run_cli("--version")
    from resmon_exporter.version import __version__

    assert version.returncode == 0 and version.stdout.startswith(f"resmon-exporter {__version__}")
    help_text = run_cli("--help").stdout
    for flag in ("--web.listen-address", "--web.telemetry-path", "--gpu.backend", "--collect.cache-ttl",
                 "--collect.timeout", "--no-collector.gpu", "--no-collector.host", "--log.level", "--log.format",
                 "RESMON_WEB_LISTEN_ADDRESS"):
        assert flag in help_text


def test_console_script_serves(scenario, fake_libs, tmp_path):
    scenario.write(three_gpus())
    script = Path(sys.executable).parent / "resmon-exporter"
    assert script.exists(), "pip install -e . provides the resmon-exporter console script"
    exporter = Exporter([], nvml_env(fake_libs["current"], scenario), command=[str(script)])
    try:
        exporter.wait_listening()
        # a scrape before the first GPU read is done serves the host alone (README, start-up)
        assert exporter.wait_for(lambda s: s.has("resmon_gpu_devices")).value("resmon_gpu_devices") == 3
    finally:
        assert exporter.stop() == 0


def test_port_in_use_is_one_line_nonzero(scenario):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        result = run_cli(f"--web.listen-address=127.0.0.1:{port}", "--gpu.backend=none")
    finally:
        holder.close()
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "level=error" in line]
    assert len(errors) == 1 and "address already in use" in errors[0].lower(), result.stderr
    assert "Traceback" not in result.stderr


def test_env_vars_configure_and_flags_override(run_exporter, scenario):
    scenario.write(three_gpus())
    exporter = run_exporter(env={"RESMON_WEB_TELEMETRY_PATH": "/stats", "RESMON_LOG_FORMAT": "json",
                                 "RESMON_COLLECTOR_HOST": "false"}, wait=False)
    # JSON log lines: the rig looks for logfmt, so find the port from the JSON line instead
    import json
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and exporter.port is None:
        for line in exporter.stderr_lines:
            if line.startswith("{") and json.loads(line).get("msg") == "listening":
                exporter.port = int(json.loads(line)["address"].rsplit(":", 1)[1])
        time.sleep(0.05)
    assert exporter.port is not None, exporter.stderr
    status, _, body = exporter.request("/stats")
    assert status == 200 and b"resmon_gpu_devices" in body
    assert b"resmon_memory_total_bytes" not in body  # RESMON_COLLECTOR_HOST=false
    assert exporter.request("/metrics")[0] == 404
    first = json.loads(exporter.stderr_lines[0])
    assert {"ts", "level", "msg"} <= set(first)

    flagged = run_exporter("--web.telemetry-path=/m", "--collector.host", env={"RESMON_WEB_TELEMETRY_PATH": "/stats"})
    assert flagged.request("/m")[0] == 200
    assert b"resmon_memory_total_bytes" in flagged.request("/m")[2]


def test_unknown_env_var_is_warned_about(run_exporter, scenario):
    exporter = run_exporter("--gpu.backend=none", env={"RESMON_COLLECT_TIMEOUTS": "2s"})
    exporter.scrape()
    assert "unknown environment variable RESMON_COLLECT_TIMEOUTS" in exporter.stderr


def test_http_routes(run_exporter, scenario):
    scenario.write(three_gpus())
    exporter = run_exporter()
    status, headers, body = exporter.request("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"resmon-exporter" in body and b'href="/metrics"' in body
    assert exporter.request("/-/healthy")[0] == 200
    exporter.wait_ready()
    assert exporter.request("/-/ready")[0] == 200
    for path in ("/metricsx", "/favicon.ico", "/-/reload", "/metrics/"):
        assert exporter.request(path)[0] == 404, path
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
        status, headers, _ = exporter.request("/metrics", method=method)
        assert status == 405, method
        assert headers["allow"] == "GET, HEAD"
    # HEAD: http.client never reads a HEAD body, so check the wire: the next response
    # starts right after HEAD's head on the same connection
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /-/healthy HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) > 1000
    assert rest.startswith(b"HTTP/1.1 200 ") and rest.endswith(b"resmon-exporter is healthy.\n")
    # ?name[]= filtering as prometheus_client does it
    status, _, body = exporter.request("/metrics?name[]=resmon_gpu_devices")
    assert status == 200 and body.decode().count("\nresmon_") + body.decode().startswith("resmon_") >= 1
    assert b"resmon_gpu_up" not in body


def test_ready_waits_for_first_refresh(run_exporter, scenario):
    scenario.write({**three_gpus(), "delay_ms.nvmlInitWithFlags": 1500})
    exporter = run_exporter(ready=False)
    assert exporter.request("/-/ready")[0] == 503  # first refresh still in the driver
    assert exporter.request("/-/healthy")[0] == 200
    exporter.wait_ready()


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_exit_zero(run_exporter, scenario, signame):
    import signal

    exporter = run_exporter("--gpu.backend=none")
    exporter.scrape()
    exporter.proc.send_signal(getattr(signal, signame))
    assert exporter.proc.wait(15) == 0
    assert "Traceback" not in exporter.stderr
