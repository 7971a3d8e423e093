"""Basic auth that tells nobody which users exist and that nobody can use to starve
Prometheus; web config reloads that fail closed. Timing assertions use wide ratios: the
properties are orders of magnitude apart (bcrypt cost 4 vs 12 is a factor of 256)."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import signal
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from certs import CA
from resmon_exporter.http.web_config import Authenticator
from scenarios import three_gpus
from test_http_framing import Wire, basic, get


@pytest.fixture
def machine(scenario):
    scenario.write(three_gpus())
    return scenario


def hashed(password: bytes, cost: int) -> bytes:
    return bcrypt.hashpw(password, bcrypt.gensalt(cost))


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def write_config(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def status(exporter, path: str = "/-/healthy", *headers: str) -> int:
    wire = Wire(exporter.port)
    try:
        wire.send(get(path, *headers, "Connection: close"))
        return wire.response()[0]
    finally:
        wire.close()


# -- no user enumeration ---------------------------------------------------------------------


def test_unknown_user_costs_as_much_as_the_slowest_configured_hash():
    # the cheap user first: the old dummy took the first user's cost
    auth = Authenticator({"cheap": hashed(b"a", 4), "slow": hashed(b"b", 12)})
    slow = min(timed(lambda: auth.check("slow", f"wrong{i}")) for i in range(2))
    unknown = min(timed(lambda: auth.check("mallory", f"guess{i}")) for i in range(2))
    assert unknown > slow * 0.5, (unknown, slow)  # cost 12, not cost 4 (a factor of 256 apart)
    # and the user with the cheap hash answers as late: its cost does not show either
    cheap = min(timed(lambda: auth.check("cheap", f"wrong{i}")) for i in range(2))
    assert cheap > slow * 0.5, (cheap, slow)


def test_long_passwords_get_401_for_known_and_unknown_users(run_exporter, machine, tmp_path):
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  alice: '{hashed(b'pw', 4).decode()}'\n")
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    long = "x" * 100  # bcrypt 5 refuses passwords over 72 bytes with ValueError
    for user in ("alice", "mallory"):
        wire = Wire(exporter.port)
        try:
            wire.send(get("/metrics", basic(user, long)))
            code, headers, _ = wire.response()
            assert code == 401 and "www-authenticate" in headers, user
            wire.send(get("/-/healthy", basic("alice", "pw")))  # and the connection goes on
            assert wire.response()[0] == 200
        finally:
            wire.close()
    assert "Traceback" not in exporter.stderr


def test_repeated_wrong_password_costs_no_bcrypt():
    auth = Authenticator({"alice": hashed(b"pw", 12)})
    first = timed(lambda: auth.check("alice", "wrong"))
    again = timed(lambda: auth.check("alice", "wrong"))
    auth.check("mallory", "x")
    unknown_again = timed(lambda: auth.check("mallory", "x"))
    assert auth.check("alice", "pw") is True and auth.check("alice", "wrong") is False
    assert again < first / 20 and unknown_again < first / 20, (first, again, unknown_again)


def test_one_check_runs_for_credentials_already_being_checked():
    from concurrent.futures import ThreadPoolExecutor

    auth = Authenticator({"alice": hashed(b"pw", 4)})
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(release.wait, 30)  # holds the one worker: the checks below stay queued
        first = auth.submit(pool, "alice", "pw")
        assert auth.in_flight("alice", "pw") is first
        assert auth.submit(pool, "alice", "pw") is first  # the same check, not a second one
        other = auth.submit(pool, "alice", "wrong")  # other credentials: a check of their own
        assert other is not first and auth.in_flight("alice", "wrong") is other
        release.set()
        assert first.result(30) is True and other.result(30) is False
        deadline = time.monotonic() + 10  # the done callbacks run on the worker, after result()
        while auth.in_flight("alice", "pw") is not None or auth.in_flight("alice", "wrong") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert auth.cached("alice", "pw") is True and auth.cached("alice", "wrong") is False
    finally:
        release.set()
        pool.shutdown(wait=True)


# -- floods ------------------------------------------------------------------------------------


def test_auth_flood_does_not_starve_an_authorised_scrape(run_exporter, machine, tmp_path):
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prometheus: '{hashed(b'secret', 12).decode()}'\n")
    exporter = run_exporter(f"--web.config.file={cfg}", "--collect.cache-ttl=0", ready=False)
    good = {"Authorization": "Basic " + base64.b64encode(b"prometheus:secret").decode()}
    assert exporter.request("/metrics", headers=good)[0] == 200  # the success is cached from now on

    def scrape_latency() -> float:
        started = time.perf_counter()
        code, _, _ = exporter.request("/metrics", headers=good, timeout=60)
        assert code == 200
        return time.perf_counter() - started

    quiet = sorted(scrape_latency() for _ in range(5))[2]
    stop = threading.Event()
    answers: list[int] = []

    def flood(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                code = exporter.request("/-/healthy", headers={"Authorization": "Basic " + base64.b64encode(
                    f"prometheus:wrong-{n}-{i}".encode()).decode()}, timeout=60)[0]
                answers.append(code)
            except OSError:
                answers.append(0)  # a dropped connection: counted, and fails the test below

    # on /-/healthy (--web.max-requests does not bound it), more clients than the old shared pool (44)
    threads = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(64)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # let the flood build up (the old server queued bcrypt behind it)
        loaded = sorted(scrape_latency() for _ in range(5))[2]
        before_exit = list(answers)
        # SIGTERM during the flood: queued password checks are dropped, not waited for
        exporter.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        exporter.proc.wait(15)
        shutdown = time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert loaded < 0.5, f"authorised scrape took {loaded:.3f}s under the flood ({quiet:.3f}s without)"
    assert shutdown < 5, f"SIGTERM took {shutdown:.1f}s under the flood"
    print(f"authorised scrape: {quiet * 1000:.1f} ms quiet, {loaded * 1000:.1f} ms under the flood; "
          f"SIGTERM {shutdown:.2f} s; flood answers {len(before_exit)}")
    assert before_exit and set(before_exit) <= {401, 429}, sorted(set(before_exit))


# -- reloads fail closed --------------------------------------------------------------------


@pytest.fixture
def auth_config(tmp_path):
    cfg = tmp_path / "web.yml"
    text = f"basic_auth_users:\n  alice: '{hashed(b'pw', 4).decode()}'\n"
    write_config(cfg, text)
    return cfg, text


@pytest.mark.parametrize("broken", ["", "# nothing here\n", "basic_auth_users:\n", "basic_auth_users: {}\n",
                                    "http_server_config: {headers: {X-Frame-Options: deny}}\n"])
def test_a_reload_that_drops_every_user_is_refused(run_exporter, machine, auth_config, broken):
    cfg, _ = auth_config
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    assert status(exporter) == 401
    write_config(cfg, broken)
    assert status(exporter) == 401  # still required
    assert status(exporter, "/-/healthy", basic("alice", "pw")) == 200
    errors = [l for l in exporter.stderr_lines if "level=error" in l and "web config reload failed" in l]
    assert len(errors) == 1, exporter.stderr


def test_a_reload_with_a_list_for_a_string_keeps_the_last_good_config(run_exporter, machine, tmp_path):
    ca = CA(tmp_path, "server-ca")
    ca.issue("server", "localhost")
    cfg = tmp_path / "web.yml"
    tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    write_config(cfg, tls)
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    write_config(cfg, tls + "  min_version: [TLS12]\n")
    ctx = ssl.create_default_context(cafile=str(ca.cert_file))
    for _ in range(3):  # every request is answered; the error is logged once, not per request
        conn = http.client.HTTPSConnection("127.0.0.1", exporter.port, context=ctx, timeout=10)
        try:
            conn.request("GET", "/-/healthy")
            assert conn.getresponse().status == 200
        finally:
            conn.close()
    errors = [l for l in exporter.stderr_lines if "level=error" in l]
    assert len(errors) == 1 and "min_version: expected" in errors[0], exporter.stderr


def test_a_fifo_as_web_config_does_not_freeze_serving(run_exporter, machine, auth_config, tmp_path):
    cfg, _ = auth_config
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, cfg)  # the config is now a FIFO nobody writes to
    assert status(exporter, "/-/healthy", basic("alice", "pw")) == 200
    assert status(exporter) == 401
    assert "not a regular file" in exporter.stderr


# -- reloads keep what was verified ----------------------------------------------------------


def test_a_reload_keeps_verified_credentials_whose_hash_did_not_change(run_exporter, machine, tmp_path):
    from resmon_exporter.http.server import BCRYPT_QUEUE

    cfg = tmp_path / "web.yml"
    alice = hashed(b"pw", 12).decode()  # about 0.25 s a check: concurrent checks pile up
    write_config(cfg, f"basic_auth_users:\n  alice: '{alice}'\n")
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    assert status(exporter, "/-/healthy", basic("alice", "pw")) == 200  # verified once, cached

    def reload(text: str) -> None:
        done = exporter.stderr.count("web config reloaded")
        write_config(cfg, text)
        exporter.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while exporter.stderr.count("web config reloaded") == done:
            assert time.monotonic() < deadline, exporter.stderr
            time.sleep(0.02)

    def burst(user: str, password: str) -> list[int]:
        # more scrapers at once than password checks may queue: any bcrypt work shows as 429
        n = BCRYPT_QUEUE * 3 + 2
        gate = threading.Barrier(n)
        codes: list[int] = []

        def one() -> None:
            gate.wait(10)
            codes.append(status(exporter, "/-/healthy", basic(user, password)))

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return sorted(codes)

    # a user added and a header changed: alice's hash is the same, so is her verified password
    bob = hashed(b"pw2", 4).decode()
    reload(f"basic_auth_users:\n  alice: '{alice}'\n  bob: '{bob}'\n"
           "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    codes = burst("alice", "pw")
    assert codes == [200] * len(codes), codes
    assert exporter.request("/-/healthy", headers={"Authorization": basic("bob", "pw2").split(": ", 1)[1]})[0] == 200
    # alice's hash changed: her old password is checked anew (and refused), never served from the cache
    reload(f"basic_auth_users:\n  alice: '{hashed(b'new', 4).decode()}'\n  bob: '{bob}'\n")
    assert status(exporter, "/-/healthy", basic("alice", "pw")) == 401
    assert status(exporter, "/-/healthy", basic("alice", "new")) == 200
    assert "Traceback" not in exporter.stderr


def test_a_reload_with_a_re_salted_hash_of_the_same_password_sends_no_scrape_to_429(run_exporter, machine, tmp_path):
    # configuration tools hash the password anew on every run (a new salt): each reload
    # changes the stored hash, so the password is checked again, but once for every scraper
    # that sends it at the same time (the others wait for that check), never a 429
    from resmon_exporter.http.server import BCRYPT_QUEUE

    cfg = tmp_path / "web.yml"
    write_config(cfg, f"basic_auth_users:\n  alice: '{hashed(b'pw', 12).decode()}'\n")
    exporter = run_exporter(f"--web.config.file={cfg}", ready=False)
    assert status(exporter, "/-/healthy", basic("alice", "pw")) == 200

    n = BCRYPT_QUEUE * 3 + 2  # more scrapers at once than password checks may queue
    for _ in range(3):
        done = exporter.stderr.count("web config reloaded")
        write_config(cfg, f"basic_auth_users:\n  alice: '{hashed(b'pw', 12).decode()}'\n")
        exporter.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while exporter.stderr.count("web config reloaded") == done:
            assert time.monotonic() < deadline, exporter.stderr
            time.sleep(0.02)
        gate = threading.Barrier(n)
        codes: list[int] = []

        def one() -> None:
            gate.wait(10)
            codes.append(status(exporter, "/-/healthy", basic("alice", "pw")))

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(codes) == [200] * n, sorted(codes)
    # the wrong password is still refused after the re-salted reloads
    assert status(exporter, "/-/healthy", basic("alice", "wrong")) == 401
    assert "Traceback" not in exporter.stderr
