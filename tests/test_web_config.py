"""--web.config.file parsing: strict, one clear message per problem; promtool agrees; fuzzed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs import CA
from resmon_exporter.http import web_config
from resmon_exporter.http.web_config import WebConfigError, parse
from fakenvml import REPO, nvml_env

EXAMPLE = REPO / "examples" / "web-config.yml"
PLACEHOLDER = "REPLACE-WITH-A-BCRYPT-HASH"
# a fixed salt: the hash is in test ids, which every pytest-xdist worker must collect alike
HASH = bcrypt.hashpw(b"secret", b"$2b$04$resmonExporterTestSalu").decode()


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    ca = CA(tmp_path, "server-ca")
    issued = ca.issue("server", "localhost")
    client_ca = CA(tmp_path, "client-ca")
    assert issued.cert.name == "server.crt" and client_ca.cert_file.name == "client-ca.crt"
    return tmp_path


def _example_with_a_hash(tls_dir: Path, password: str) -> Path:
    """The example as its comment says to finish it: the placeholder replaced by the hash that
    the comment's own python3 command prints (so the command shown is one that works)."""
    text = EXAMPLE.read_text()
    command = re.search(r"python3 -c '([^']+)'", text)
    assert command, "the example shows the python3 command that makes a hash"
    code = command.group(1).replace('b"your-password"', repr(password.encode()))
    hashed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert PLACEHOLDER in text
    path = tls_dir / "web-config.yml"
    path.write_text(text.replace(PLACEHOLDER, hashed))
    return path


def test_example_ships_no_working_hash_and_says_how_to_make_one(tls_dir):
    # a copied example must not let "change-me" (or any password) in: its placeholder is not
    # a bcrypt hash, so the start fails with one line saying how to make one
    text = EXAMPLE.read_text()
    assert not re.search(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}", text), "examples/web-config.yml ships a bcrypt hash"
    assert "htpasswd -nBC 10" in text
    shutil.copy(EXAMPLE, tls_dir / "web-config.yml")
    with pytest.raises(WebConfigError, match=r"basic_auth_users.prometheus: not a bcrypt hash.*htpasswd -nBC 10"):
        web_config.load(tls_dir / "web-config.yml")
    result = subprocess.run([sys.executable, "-m", "resmon_exporter", f"--web.config.file={tls_dir / 'web-config.yml'}",
                             "--gpu.backend=none"], env=nvml_env(None, None), cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "htpasswd -nBC 10" in lines[0], result.stderr


def test_example_file_parses(tls_dir):
    config = web_config.load(_example_with_a_hash(tls_dir, "s3cret"))
    assert config.tls is not None and config.tls.client_ca_file == tls_dir / "client-ca.crt"
    assert ("X-Frame-Options", "deny") in config.headers
    assert bcrypt.checkpw(b"s3cret", config.users["prometheus"])
    assert not bcrypt.checkpw(b"change-me", config.users["prometheus"])


def test_promtool_accepts_the_example(tls_dir):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: scripts/test.sh installs Debian's prometheus package")
    path = _example_with_a_hash(tls_dir, "s3cret")
    result = subprocess.run([promtool, "check", "web-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "text, needle",
    [
        ("tls_server_config: {cert_file: server.crt, key_file: server.key}\nextra: 1\n", "unknown key 'extra'"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_ca: x}\n", "unknown key 'client_ca'"),
        ("tls_server_config: {cert_file: server.crt}\n", "missing key_file"),
        ("tls_server_config: {key_file: server.key}\n", "missing cert_file"),
        ("tls_server_config: {cert_file: nope.crt, key_file: server.key}\n", "nope.crt' does not exist"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_ca_file: client-ca.crt}\n",
         "client_auth_type is NoClientCert"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: RequireAndVerifyClientCert}\n",
         "needs client_ca_file"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: RequireAnyClientCert,"
         " client_ca_file: client-ca.crt}\n", "RequireAnyClientCert is not supported"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: Sometimes}\n", "unknown value"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS14}\n", "unknown TLS version"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS13, max_version: TLS12}\n",
         "min_version is above max_version"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: [TLS_FAKE]}\n",
         "unknown cipher suite 'TLS_FAKE'"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, curve_preferences: [CurveP999]}\n", "unknown curve"),
        ("tls_server_config: {cert_file: server.key, key_file: server.key}\n", "cannot load certificate"),
        ("http_server_config: {headers: {X-Powered-By: me}}\n", "'X-Powered-By' can not be configured"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "invalid value 'allow'"),
        ("http_server_config: {http2: maybe}\n", "expected bool"),
        ("http_server_config: {timeout: 1}\n", "unknown key 'timeout'"),
        ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users: {alice: '$2b$10$short'}\n", "not a bcrypt hash"),
        (f"basic_auth_users:\n  alice: '{HASH}'\n  alice: '{HASH}'\n", "duplicate key 'alice'"),
        ("basic_auth_users: [alice]\n", "expected dict"),
        ("tls_server_config: [\n", "not valid YAML"),
        # a list or dict where a string belongs: a WebConfigError, not a TypeError
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: [TLS12]}\n",
         "tls_server_config.min_version: expected a non-empty str"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, max_version: {TLS13: 1}}\n",
         "tls_server_config.max_version: expected"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: [x]}\n",
         "client_auth_type: expected"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, cipher_suites: [[TLS_FAKE]]}\n",
         "cipher_suites (entry): expected"),
        ("tls_server_config: {cert_file: server.crt, key_file: server.key, curve_preferences: [{X25519: 1}]}\n",
         "curve_preferences (entry): expected"),
        ("http_server_config: {headers: {X-Frame-Options: [deny]}}\n", "headers.X-Frame-Options: expected"),
        ("http_server_config: {headers: {1: deny}}\n", "header name"),
        (f"basic_auth_users: {{1: '{HASH}'}}\n", "user name"),
        # header values that cannot go on the wire as they are
        ("http_server_config: {headers: {Content-Security-Policy: \"default-src \u2018self\u2019\"}}\n",
         "Content-Security-Policy: value"),
        ("http_server_config: {headers: {Content-Security-Policy: \"a\\0b\"}}\n", "no control characters"),
        ("http_server_config: {headers: {Content-Security-Policy: \"a\\x7fb\"}}\n", "no control characters"),
        ("http_server_config: {headers: {X-XSS-Protection: \"1 \"}}\n", "visible ASCII"),
        # absurd bcrypt costs (bcrypt's own maximum is 31; each step doubles the work)
        (f"basic_auth_users: {{alice: '{HASH.replace('$04$', '$18$')}'}}\n", "bcrypt cost 18 is above 17"),
        (f"basic_auth_users: {{alice: '{HASH.replace('$04$', '$31$')}'}}\n", "bcrypt cost 31 is above 17"),
        ("- just\n- a list\n", "web config: expected dict"),
    ],
)
def test_invalid_files_name_the_problem(tls_dir, text, needle):
    with pytest.raises(WebConfigError) as err:
        parse(text, tls_dir)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_valid_variants(tls_dir):
    empty = parse("", tls_dir)
    assert empty.tls is None and not empty.users and empty.headers == ()
    auth_only = parse(f"basic_auth_users:\n  alice: '{HASH}'\n", tls_dir)
    assert auth_only.tls is None and set(auth_only.users) == {"alice"}
    tls = parse(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n  curve_preferences: [CurveP256]\n"
        "http_server_config: {http2: false}\n",
        tls_dir,
    )
    assert tls.tls is not None and tls.tls.curve == "prime256v1"
    assert tls.tls.context().minimum_version.name == "TLSv1_3"


def test_bad_config_is_a_one_line_startup_error(tls_dir, tmp_path):
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: {alice: nothash}\n")
    typed = tls_dir / "typed.yml"
    typed.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: [TLS12]}\n")
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    cases = ((bad, "not a bcrypt hash"), (tmp_path / "missing.yml", "cannot read"), (typed, "min_version: expected"),
             (fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"))
    for path, needle in cases:
        result = subprocess.run([sys.executable, "-m", "resmon_exporter", f"--web.config.file={path}", "--gpu.backend=none"],
                                env=nvml_env(None, None), cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


# -- fuzzing: whatever the file holds, the parser answers with a config or one WebConfigError --

_keys = st.sampled_from(
    ["tls_server_config", "http_server_config", "basic_auth_users", "cert_file", "key_file", "client_auth_type",
     "client_ca_file", "min_version", "max_version", "cipher_suites", "headers", "http2", "alice", "x"]
)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=12),
                  st.sampled_from(["server.crt", "server.key", "client-ca.crt", "TLS12", "TLS13", "NoClientCert",
                                   "RequireAndVerifyClientCert", HASH, "deny", "nosniff", "CurveP256",
                                   "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]))
# any value at all: what a typo'd YAML file puts where a string belongs
_any = st.recursive(_leaf, lambda children: st.one_of(st.lists(children, max_size=3),
                                                     st.dictionaries(_leaf, children, max_size=3)), max_leaves=6)
_docs = st.recursive(_leaf, lambda children: st.one_of(st.lists(children, max_size=3),
                                                      st.dictionaries(_keys, children, max_size=4)), max_leaves=12)


def _section(required: dict, optional: list[str]) -> st.SearchStrategy:
    """A section with its required keys at valid values (so validation goes on to the rest)
    and any subset of the other keys at any value, lists and dicts included."""
    return st.fixed_dictionaries(required, optional={key: _any for key in optional})


_tls_sections = _section(
    {"cert_file": st.just("server.crt"), "key_file": st.just("server.key")},
    ["client_auth_type", "client_ca_file", "min_version", "max_version", "cipher_suites",
     "prefer_server_cipher_suites", "curve_preferences"],
) | st.fixed_dictionaries({}, optional={key: _any for key in ("cert_file", "key_file", "min_version")})
_list_positions = st.fixed_dictionaries(
    {"cert_file": st.just("server.crt"), "key_file": st.just("server.key")},
    optional={"cipher_suites": st.lists(_any, max_size=3), "curve_preferences": st.lists(_any, max_size=2)},
)
_header_sections = st.fixed_dictionaries({}, optional={
    "http2": _any,
    "headers": st.dictionaries(st.one_of(st.sampled_from(list(web_config.HEADERS)), _leaf), _any, max_size=3)
    | st.dictionaries(st.sampled_from(list(web_config.HEADERS)), st.text(max_size=20), max_size=3),
})
_user_sections = st.dictionaries(st.one_of(_leaf, st.sampled_from(["alice", "bob"])), _any, max_size=3)
_typed_docs = st.fixed_dictionaries({}, optional={
    "tls_server_config": _tls_sections | _list_positions | _any,
    "http_server_config": _header_sections | _any,
    "basic_auth_users": _user_sections | _any,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_docs)
def test_fuzz_structured_documents(tls_dir, doc):
    try:
        parse(yaml.safe_dump(doc), tls_dir)
    except WebConfigError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_typed_docs)
def test_fuzz_every_value_position_with_any_type(tls_dir, doc):
    """Lists, dicts, ints, None and odd text in each key of each section: a config or a
    WebConfigError, never another exception; headers that pass go on the wire as they are."""
    try:
        config = parse(yaml.safe_dump(doc, allow_unicode=True), tls_dir)
    except WebConfigError as exc:
        assert "\n" not in str(exc)
        return
    for name, value in config.headers:
        value.encode("ascii")
        assert value == value.strip() and not any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_fuzz_raw_text(tls_dir, text):
    try:
        parse(text, tls_dir)
    except WebConfigError:
        pass


def test_without_a_web_config_neither_yaml_nor_bcrypt_is_loaded(tmp_path):
    """Their 1.4 MiB are paid only by users who configure TLS or basic auth (import cost,
    docs/performance.md); a web config loads them and checks passwords as before."""
    users = tmp_path / "web.yml"
    users.write_text(f"basic_auth_users:\n  alice: {bcrypt.hashpw(b'secret', bcrypt.gensalt(4)).decode()}\n")
    probe = (
        "import logging, sys; from pathlib import Path; from resmon_exporter.http.web_config import WebConfigSource\n"
        "_, _, auth = WebConfigSource(None, logging.getLogger()).current()\n"
        "print(sorted(m for m in ('yaml', 'bcrypt') if m in sys.modules), auth.enabled, auth.check('alice', 'secret'))\n"
        "_, _, auth = WebConfigSource(Path(sys.argv[1]), logging.getLogger()).current()\n"
        "print(sorted(m for m in ('yaml', 'bcrypt') if m in sys.modules), auth.enabled, auth.check('alice', 'secret'), auth.check('alice', 'wrong'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(users)], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.splitlines() == ["[] False False", "['bcrypt', 'yaml'] True True False"]
