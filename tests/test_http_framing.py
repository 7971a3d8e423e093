"""HTTP framing and routing on the wire: HEAD, Connection, Expect, negotiation, routing
after decoding, the scrape deadline's floor, signals. Raw sockets where framing matters:
responses are parsed by Content-Length, so a stray body or a missing close shows."""

from __future__ import annotations

import base64
import gzip
import signal
import socket
import threading
import time

import bcrypt
import pytest

from fakenvml import Scrape
from scenarios import three_gpus


class Wire:
    """One raw client connection that parses responses by their Content-Length."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next response; head_only: a HEAD answer (no body follows, whatever its length)."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise AssertionError(f"connection closed mid-response: {self.buf[:200]!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_only or 100 <= status < 200:
            return status, headers, b""
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            if not self._fill():
                raise AssertionError("connection closed mid-body")
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def closed_by_server(self) -> bool:
        """True when the server closed (EOF/reset) with nothing more sent; False on timeout."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return not self.buf
                self.buf += chunk
        except ConnectionResetError:
            return not self.buf
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def quietly(call) -> None:
    """Run call in a thread whose failure (the exporter exits under it) is expected."""
    def run() -> None:
        try:
            call()
        except OSError:
            pass

    threading.Thread(target=run, daemon=True).start()


def get(path: str, *headers: str, method: str = "GET") -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def basic(user: str, password: str) -> str:
    return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def machine(scenario):
    scenario.write(three_gpus())
    return scenario


def test_head_401_has_no_body_on_a_kept_alive_connection(run_exporter, machine, tmp_path):
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  alice: '{bcrypt.hashpw(b'pw', bcrypt.gensalt(4)).decode()}'\n")
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    wire = Wire(exporter.port)
    try:
        # pipelined: HEAD without credentials, then a GET: the GET's answer must follow the
        # HEAD's head directly
        wire.send(get("/metrics", method="HEAD") + get("/-/healthy", basic("alice", "pw")))
        status, headers, _ = wire.response(head_only=True)
        assert status == 401 and "www-authenticate" in headers
        assert wire.buf == b"" or wire.buf.startswith(b"HTTP/1.1 "), wire.buf[:80]
        status, _, body = wire.response()
        assert status == 200 and body == b"resmon-exporter is healthy.\n"
    finally:
        wire.close()


def test_head_has_the_get_headers_and_no_body(run_exporter, machine):
    exporter = run_exporter()
    exporter.wait_ready()
    wire = Wire(exporter.port)
    try:
        wire.send(get("/metrics", method="HEAD") + get("/metrics", method="HEAD") + get("/-/healthy"))
        _, first, _ = wire.response(head_only=True)
        _, second, _ = wire.response(head_only=True)
        status, _, body = wire.response()
        assert status == 200 and body == b"resmon-exporter is healthy.\n"
        wire.send(get("/metrics"))
        _, got, body = wire.response()
    finally:
        wire.close()
    assert set(first) == set(got) == set(second)
    assert int(first["content-length"]) > 1000 and first["content-type"] == got["content-type"]


def test_connection_close_wins_over_keep_alive(run_exporter, machine):
    exporter = run_exporter()
    wire = Wire(exporter.port, timeout=5)
    try:
        wire.send(get("/-/healthy", "Connection: close, keep-alive"))
        status, headers, _ = wire.response()
        assert status == 200 and headers.get("connection", "").lower() == "close"
        assert wire.closed_by_server()
    finally:
        wire.close()


def test_expect_100_continue_is_answered(run_exporter, machine):
    exporter = run_exporter()
    wire = Wire(exporter.port, timeout=5)
    try:
        wire.send(b"POST /-/healthy HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = wire.response()
        assert status == 100
        wire.send(b"hello")
        status, headers, _ = wire.response()
        assert status == 405 and headers["allow"] == "GET, HEAD"
    finally:
        wire.close()


def test_telemetry_responses_vary_on_accept_and_encoding(run_exporter, machine):
    exporter = run_exporter()
    status, headers, _ = exporter.request("/metrics")
    assert status == 200 and headers["vary"] == "Accept, Accept-Encoding"


@pytest.mark.parametrize(
    "accept_encoding, gzipped",
    [("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False), ("*", True), ("*;q=0", False),
     ("identity", False), ("br;q=1, gzip;q=0.5", True)],
)
def test_gzip_honours_q_values(run_exporter, machine, accept_encoding, gzipped):
    exporter = run_exporter()
    status, headers, body = exporter.request("/metrics", headers={"Accept-Encoding": accept_encoding})
    assert status == 200
    assert (headers.get("content-encoding") == "gzip") is gzipped
    text = gzip.decompress(body) if gzipped else body
    assert b"resmon_gpu_up" in text


@pytest.mark.parametrize(
    "accept, openmetrics",
    [
        ("application/openmetrics-text; version=1.0.0garbage", False),
        ("application/openmetrics-text; version=abc", False),
        ("application/openmetrics-text; version=9.9.9", False),
        ("application/openmetrics-text; version=1.0.0; q=0", False),
        ("application/openmetrics-text; version=1.0.0", True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2", True),
        ("text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5", False),
    ],
)
def test_negotiation_serves_only_known_versions(run_exporter, machine, accept, openmetrics):
    exporter = run_exporter()
    status, headers, body = exporter.request("/metrics", headers={"Accept": accept})
    assert status == 200, body[:200]
    expected = ("application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores" if openmetrics
                else "text/plain; version=0.0.4; charset=utf-8")
    assert headers["content-type"] == expected
    assert body.rstrip().endswith(b"# EOF") is openmetrics
    assert "level=error" not in exporter.stderr


def test_percent_encoded_telemetry_path_counts_against_max_requests(run_exporter, machine):
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 2000})
    exporter = run_exporter("--collect.cache-ttl=0", "--web.max-requests=1")
    exporter.wait_ready()
    result = {}

    def slow_scrape():
        result["status"] = exporter.request("/metrics", timeout=30)[0]

    t = threading.Thread(target=slow_scrape)
    t.start()
    time.sleep(0.5)  # the first scrape is now inside its 2 s driver call (bounded by the thread join below)
    status, _, body = exporter.request("/metric%73", timeout=30)
    t.join(30)
    assert result["status"] == 200
    assert status == 503, body[:200]  # the same route as /metrics, so the same limit


def test_percent_encoded_telemetry_path_serves_metrics(run_exporter, machine):
    exporter = run_exporter()
    status, _, body = exporter.request("/metric%73")
    assert status == 200 and b"resmon_gpu_up" in body


def test_scrape_timeout_header_has_a_floor(run_exporter, machine):
    # 100 ms for one GPU read: a deadline of 0.5 - 0.5 s offset must still let it finish (floor 0.25 s)
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 100})
    exporter = run_exporter("--collect.cache-ttl=0")
    exporter.wait_ready()
    status, _, body = exporter.request("/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.5"})
    assert status == 200
    assert Scrape(body.decode()).value("resmon_collector_success", collector="gpu") == 1


def test_listening_line_names_every_bound_address(run_exporter, machine):
    exporter = run_exporter()
    line = next(l for l in exporter.stderr_lines if "msg=listening" in l)
    address = line.split("address=", 1)[1].split(" ", 1)[0]
    assert address == f"127.0.0.1:{exporter.port}"


def test_sighup_reloads_the_web_config_instead_of_killing(run_exporter, machine, tmp_path):
    cfg = tmp_path / "web.yml"
    cfg.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    exporter = run_exporter(f"--web.config.file={cfg}")
    exporter.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "web config reloaded" not in exporter.stderr and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exporter.proc.poll() is None
    assert "web config reloaded" in exporter.stderr
    assert exporter.request("/-/healthy")[1]["x-frame-options"] == "deny"


def test_second_sigterm_exits_at_once(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=20s")
    exporter.wait_ready()
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 6000})
    quietly(lambda: exporter.request("/metrics", timeout=30))
    time.sleep(0.5)  # the scrape is now in its 6 s driver call
    exporter.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first signal is being handled: graceful, waiting for the scrape
    assert exporter.proc.poll() is None
    exporter.proc.send_signal(signal.SIGTERM)
    assert exporter.proc.wait(4) == 128 + signal.SIGTERM  # long before the 6 s scrape ends
    assert "Traceback" not in exporter.stderr


def test_shutdown_grace_is_under_docker_stops_10s(run_exporter, machine):
    exporter = run_exporter("--collect.cache-ttl=0", "--collect.timeout=30s")
    exporter.wait_ready()
    machine.update(**{"gpu.0.delay_ms.nvmlDeviceGetUtilizationRates": 60000})
    quietly(lambda: exporter.request("/metrics", timeout=60))
    time.sleep(0.5)  # the scrape is now in a driver call that hangs for a minute
    started = time.monotonic()
    exporter.proc.send_signal(signal.SIGTERM)
    try:
        exporter.proc.wait(10)
    except Exception:
        raise AssertionError("still running 10 s after SIGTERM: docker stop would SIGKILL it") from None
    assert time.monotonic() - started < 10
    assert "Traceback" not in exporter.stderr


def test_absolute_form_request_targets_are_served_as_their_origin_form(run_exporter, machine):
    # RFC 9112 3.2.2: a server MUST accept the absolute form (what a client talking to a
    # proxy sends); the authority of the target wins over Host, which the exporter ignores
    exporter = run_exporter()
    wire = Wire(exporter.port)
    try:
        port = exporter.port
        wire.send(get(f"http://127.0.0.1:{port}/-/healthy?x=1") + get("HTTP://Other.Example/metric%73"))
        status, _, body = wire.response()
        assert status == 200 and body == b"resmon-exporter is healthy.\n", (status, body[:200])
        status, _, body = wire.response()
        assert status == 200 and b"resmon_gpu_up" in body, (status, body[:200])
        wire.send(get("http://x") + get("http://x?a=b") + get("https://x/-/ready"))
        for _ in range(2):  # an empty path is "/": the landing page
            status, _, body = wire.response()
            assert status == 200 and b'href="/metrics"' in body, (status, body[:200])
        status, _, _ = wire.response()
        assert status == 200
    finally:
        wire.close()


@pytest.mark.parametrize(
    "target",
    ["ftp://x/metrics", "http:/metrics", "http://", "http:///metrics", "http://u@x/metrics", "x/metrics", "*", "http://x/a#b"],
)
def test_a_bad_request_target_is_400(run_exporter, machine, target):
    exporter = run_exporter(ready=False)
    wire = Wire(exporter.port, timeout=5)
    try:
        wire.send(get(target))
        status, _, body = wire.response()
        assert status == 400, (target, status, body[:200])
    finally:
        wire.close()
