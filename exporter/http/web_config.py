"""--web.config.file: the Prometheus exporter-toolkit format, parsed strictly.

The same file node_exporter takes (toolkit 0.8.2 keys): tls_server_config, http_server_config
and basic_auth_users. Any unknown key, wrong type, malformed bcrypt hash, missing file or
invalid combination is a WebConfigError naming the problem. Relative paths are relative to
the file. WebConfigSource re-reads the file (and the certificate files) when they change, so
rotated certificates and changed users apply without a restart; a broken edit is logged and
the last good configuration stays in force.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import ssl
import stat
import threading
import time
from collections import OrderedDict
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..logs import fields


class WebConfigError(Exception):
    """The web config file is invalid; the message names the key and the problem."""


TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Python's ssl has no "request a certificate but do not verify it" mode, so the toolkit's
# RequestClientCert and RequireAnyClientCert are refused rather than silently weakened.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go crypto/tls names -> OpenSSL names (TLS 1.2 and below; TLS 1.3 suites are not configurable).
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# exporter-toolkit allows exactly these response headers (and these values where listed).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
BCRYPT_HASH = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
# bcrypt allows costs up to 31, but each step doubles the work: cost 17 already takes about
# 10 s a check on a server core, so anything above is refused as a configuration error.
MAX_BCRYPT_COST = 17
# What a response header value may hold: visible ASCII, inner spaces and tabs (RFC 9110 field-value).
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?")
# The web config is read whole; a bigger "config" is a mistake (or /dev/zero), not a config.
MAX_CONFIG_BYTES = 1 << 20
_TLS_KEYS = {
    "cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
    "cipher_suites", "prefer_server_cipher_suites", "curve_preferences",
}
_HTTP_KEYS = {"http2", "headers"}
_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}


@functools.cache
def _strict_loader() -> Any:
    """SafeLoader that refuses duplicate keys (a typo'd second 'user:' must not win silently).
    Built on first use: PyYAML (0.9 MiB) is only imported when there is a web config to read."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    return StrictLoader


def _mapping(loader: Any, node: Any, deep: bool = False) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in result:
                raise WebConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        except TypeError:
            raise WebConfigError(f"unhashable key at line {key_node.start_mark.line + 1}") from None
        result[key] = loader.construct_object(value_node, deep=deep)
    return result


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode
    client_ca_file: Path | None
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    ciphers: str | None
    prefer_server_ciphers: bool
    curve: str | None

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def context(self) -> ssl.SSLContext:
        """A server context from the files as they are now (WebConfigError if they are bad)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file is not None:
                ctx.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"tls_server_config: cannot load certificate or key: {exc}") from None
        ctx.verify_mode = self.client_auth
        if self.ciphers:
            try:
                ctx.set_ciphers(self.ciphers)
            except ssl.SSLError:
                raise WebConfigError("tls_server_config.cipher_suites: none of the suites is available") from None
        if self.prefer_server_ciphers:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curve:
            ctx.set_ecdh_curve(self.curve)
        return ctx


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: dict[str, bytes] = field(default_factory=dict)


def _expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or (kind is str and value == ""):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise WebConfigError(f"{where}: expected {'a non-empty ' if kind is str else ''}{names}, got {value!r}")
    return value


def _str(value: Any, where: str) -> str:
    """A non-empty string, or WebConfigError (a list or dict where a name belongs is no TypeError)."""
    return _expect(value, str, where)  # type: ignore[no-any-return]


def _check_keys(section: dict[Any, Any], allowed: set[str], where: str) -> None:
    for key in section:
        if key not in allowed:
            raise WebConfigError(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")


def _file(value: Any, base: Path, where: str) -> Path:
    path = Path(_expect(value, str, where))
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise WebConfigError(f"{where}: file {str(path)!r} does not exist")
    if not os.access(path, os.R_OK):
        raise WebConfigError(f"{where}: file {str(path)!r} is not readable")
    return path


def _tls(section: Any, base: Path) -> TlsConfig | None:
    if section is None:
        return None
    section = _expect(section, dict, "tls_server_config")
    _check_keys(section, _TLS_KEYS, "tls_server_config")
    if not section:
        return None
    if "cert_file" not in section:
        raise WebConfigError("tls_server_config: missing cert_file")
    if "key_file" not in section:
        raise WebConfigError("tls_server_config: missing key_file")
    auth_name = _str(section.get("client_auth_type", "NoClientCert"), "tls_server_config.client_auth_type")
    if auth_name in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth_name} is not supported (Python's TLS cannot request a "
            "client certificate without verifying it); use RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
    if auth_name not in CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type: unknown value {auth_name!r}")
    ca = section.get("client_ca_file")
    if ca is not None and auth_name == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    if ca is None and auth_name != "NoClientCert":
        raise WebConfigError(f"tls_server_config: client_auth_type {auth_name} needs client_ca_file")
    versions = []
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = _str(section.get(key, default), f"tls_server_config.{key}")
        if name not in TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{key}: unknown TLS version {name!r} (TLS10, TLS11, TLS12, TLS13)")
        versions.append(TLS_VERSIONS[name])
    if versions[0] > versions[1]:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    ciphers = None
    if section.get("cipher_suites") is not None:
        suites = _expect(section["cipher_suites"], list, "tls_server_config.cipher_suites")
        names = []
        for suite in suites:
            _str(suite, "tls_server_config.cipher_suites (entry)")
            if suite not in CIPHER_SUITES:
                raise WebConfigError(f"tls_server_config.cipher_suites: unknown cipher suite {suite!r}")
            names.append(CIPHER_SUITES[suite])
        if names:
            ciphers = ":".join(names)
    prefer = section.get("prefer_server_cipher_suites", True)
    _expect(prefer, bool, "tls_server_config.prefer_server_cipher_suites")
    curve = None
    if section.get("curve_preferences") is not None:
        curves = _expect(section["curve_preferences"], list, "tls_server_config.curve_preferences")
        for name in curves:
            _str(name, "tls_server_config.curve_preferences (entry)")
            if name not in CURVES:
                raise WebConfigError(f"tls_server_config.curve_preferences: unknown curve {name!r}")
        if len(curves) > 1:
            raise WebConfigError("tls_server_config.curve_preferences: Python's TLS takes one curve; list one")
        curve = CURVES[curves[0]] if curves else None
    tls = TlsConfig(
        cert_file=_file(section["cert_file"], base, "tls_server_config.cert_file"),
        key_file=_file(section["key_file"], base, "tls_server_config.key_file"),
        client_auth=CLIENT_AUTH[auth_name],
        client_ca_file=_file(ca, base, "tls_server_config.client_ca_file") if ca is not None else None,
        min_version=versions[0],
        max_version=versions[1],
        ciphers=ciphers,
        prefer_server_ciphers=prefer,
        curve=curve,
    )
    tls.context()  # load it once now: a bad certificate is a startup error
    return tls


def _headers(section: Any) -> tuple[tuple[str, str], ...]:
    if section is None:
        return ()
    section = _expect(section, dict, "http_server_config")
    _check_keys(section, _HTTP_KEYS, "http_server_config")
    if "http2" in section:  # accepted for compatibility; this server speaks HTTP/1.1
        _expect(section["http2"], bool, "http_server_config.http2")
    headers = section.get("headers") or {}
    _expect(headers, dict, "http_server_config.headers")
    out = []
    for name, value in headers.items():
        _str(name, "http_server_config.headers (header name)")
        if name not in HEADERS:
            raise WebConfigError(f"http_server_config.headers: HTTP header {name!r} can not be configured")
        _str(value, f"http_server_config.headers.{name}")
        if any(c in value for c in "\r\n"):
            raise WebConfigError(f"http_server_config.headers.{name}: value contains a line break")
        if not _HEADER_VALUE.fullmatch(value):
            # anything else is either unsendable (outside latin-1) or a control character on the wire
            raise WebConfigError(
                f"http_server_config.headers.{name}: value {value!r} must be visible ASCII "
                "(inner spaces and tabs allowed, no control characters)"
            )
        allowed = HEADERS[name]
        if allowed is not None and value.lower() not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: invalid value {value!r}")
        out.append((name, value))
    return tuple(out)


def _users(section: Any) -> dict[str, bytes]:
    if section is None:
        return {}
    section = _expect(section, dict, "basic_auth_users")
    users = {}
    for user, hashed in section.items():
        _expect(user, str, "basic_auth_users (user name)")
        if ":" in user:
            raise WebConfigError(f"basic_auth_users: user name {user!r} contains ':'")
        shown = user if user.isprintable() else repr(user)  # an error stays one line
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise WebConfigError(
                f"basic_auth_users.{shown}: not a bcrypt hash (want $2y$/$2b$/$2a$, cost, 53 characters); "
                "make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'"
            )
        if bcrypt_cost(hashed.encode()) > MAX_BCRYPT_COST:
            raise WebConfigError(
                f"basic_auth_users.{shown}: bcrypt cost {bcrypt_cost(hashed.encode())} is above {MAX_BCRYPT_COST} "
                "(every check would take seconds); hash the password again with a cost of 10 to 12"
            )
        users[user] = hashed.encode()
    return users


def bcrypt_cost(hashed: bytes) -> int:
    return int(hashed[4:6])


def parse(text: str, base: Path) -> WebConfig:
    import yaml

    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return WebConfig()
    data = _expect(data, dict, "web config")
    _check_keys(data, _TOP_KEYS, "web config")
    return WebConfig(
        tls=_tls(data.get("tls_server_config"), base),
        headers=_headers(data.get("http_server_config")),
        users=_users(data.get("basic_auth_users")),
    )


def read_regular_file(path: Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The file's bytes; WebConfigError for anything but a regular file of at most limit bytes.
    O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise WebConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WebConfigError(f"cannot read {str(path)!r}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise WebConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise WebConfigError(f"{str(path)!r} is larger than {limit} bytes")
    return data


def load(path: Path) -> WebConfig:
    data = read_regular_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WebConfigError(f"{str(path)!r} is not UTF-8 text") from None
    return parse(text, path.parent)


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


class WebConfigSource:
    """The web config in force. current() is a lookup (safe on the event loop); refresh()
    stats the files and re-reads them when they changed: it does file I/O, so callers run it
    in a thread. A reload that fails, or that would drop TLS or basic auth (an emptied or
    half-written file), is refused: the last good config stays, logged once at error."""

    def __init__(self, path: Path | None, log: logging.Logger) -> None:
        self._path = path
        self._log = log
        self._lock = threading.Lock()
        self._config = load(path) if path is not None else WebConfig()  # strict at startup
        self._ctx = self._config.tls.context() if self._config.tls else None
        self._stamps = self._current_stamps()
        self._auth = Authenticator(self._config.users)

    @property
    def tls_enabled(self) -> bool:
        return self._config.tls is not None

    @property
    def watched(self) -> bool:
        return self._path is not None

    def _current_stamps(self) -> tuple[Any, ...]:
        paths = ((self._path,) if self._path else ()) + (self._config.tls.files() if self._config.tls else ())
        return _stamp(paths)

    def current(self) -> tuple[WebConfig, ssl.SSLContext | None, "Authenticator"]:
        return self._config, self._ctx, self._auth

    def refresh(self, force: bool = False) -> None:
        """Re-read the config if a file changed (or force: SIGHUP). Blocking file I/O."""
        if self._path is None:
            if force:
                self._log.info("web config reloaded", extra=fields(file="none"))
            return
        with self._lock:
            stamps = self._current_stamps()
            if stamps == self._stamps and not force:
                return
            self._stamps = stamps
            try:
                config = load(self._path)
                ctx = config.tls.context() if config.tls else None
                refusal = self._refusal(config)
            except WebConfigError as exc:
                refusal = str(exc)
            except Exception as exc:  # a parser bug must not take serving down: keep the last good config
                refusal = f"{exc.__class__.__name__}: {exc}"
            if refusal:
                self._log.error("web config reload failed; keeping the previous one", extra=fields(error=refusal))
                return
            self._config, self._ctx = config, ctx
            if config.users != self._auth.users:
                # verified passwords of users whose hash is unchanged stay verified: an empty
                # cache would send every scraper to bcrypt at once (429 beyond its queue)
                self._auth = Authenticator(config.users, keep_from=self._auth)
            self._stamps = self._current_stamps()  # the new config's certificate files
            self._log.info("web config reloaded")

    def _refusal(self, config: WebConfig) -> str:
        if (config.tls is None) != (self._config.tls is None):
            # the listening socket cannot switch between TLS and plain text
            return "web config reload cannot turn TLS on or off; restart to do that"
        if self._config.users and not config.users:
            # fail closed: an emptied or half-written file must not turn authentication off
            return "web config reload would remove every basic_auth_users entry (authentication off); restart to do that"
        return ""


class Authenticator:
    """bcrypt basic auth that tells nobody which users exist.

    Unknown users are checked against a dummy hash with the cost of the slowest configured
    hash, built at construction; users with cheaper hashes are padded to the slowest check's
    time (measured), so no cost shows either. Any failure inside a check (bcrypt refuses passwords over 72
    bytes) is a plain "no". Recent successes and failures are cached by a hash of (user,
    password, stored hash), so a repeated wrong password costs no bcrypt; cached() answers
    from the caches only, verify() does the bcrypt work (callers bound its concurrency).
    submit() runs verify() on an executor, one check per distinct credential at a time:
    in_flight() hands a caller the check of the same (user, password, stored hash) that is
    already queued or running, whose answer it waits for without a slot of its own (a reload
    that re-salts a hash sends every scraper to bcrypt at once; they pay for one check).
    keep_from: the Authenticator of the config before a reload, whose verified successes
    are kept for every user whose stored hash did not change."""

    FAILURE_TTL = 30.0
    MAX_CACHED = 4096

    def __init__(self, users: dict[str, bytes], keep_from: "Authenticator | None" = None) -> None:
        self.users = users
        self._ok: OrderedDict[bytes, str] = OrderedDict()  # key -> the user it verified
        self._failed: OrderedDict[bytes, float] = OrderedDict()  # key -> expiry (monotonic)
        self._lock = threading.Lock()
        self._flights: dict[bytes, Future[bool]] = {}  # key -> the check queued or running
        cost = max((bcrypt_cost(h) for h in users.values()), default=4)
        self._max_cost = cost
        self._slowest = 0.0  # seconds a check at the slowest cost took (the latest measured)
        self.dummy = b""
        if users:  # without users nothing is checked: bcrypt (0.5 MiB) is not even imported
            import bcrypt

            # a real salt of that cost plus a well-formed digest: checking against it costs the
            # full bcrypt work, without paying that work here at load
            tail = bcrypt.hashpw(b"resmon-dummy", bcrypt.gensalt(4))[-31:]
            self.dummy = bcrypt.gensalt(cost) + tail
        if keep_from is not None:
            with keep_from._lock:
                kept = [(k, u) for k, u in keep_from._ok.items() if u in users and users[u] == keep_from.users.get(u)]
            self._ok.update(kept)  # in their LRU order; failures start afresh

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def _key(self, user: str, password: str) -> bytes:
        stored = self.users.get(user, self.dummy)
        return hashlib.sha256(b"\0".join((user.encode(), password.encode(), stored))).digest()

    def cached(self, user: str, password: str) -> bool | None:
        """True or False when a recent check answered this; None when bcrypt must run."""
        key = self._key(user, password)
        with self._lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return True
            expiry = self._failed.get(key)
            if expiry is not None:
                if expiry > time.monotonic():
                    return False
                del self._failed[key]
        return None

    def in_flight(self, user: str, password: str) -> "Future[bool] | None":
        """The check of these credentials that is queued or running, or None."""
        key = self._key(user, password)
        with self._lock:
            return self._flights.get(key)

    def submit(self, executor: Executor, user: str, password: str) -> "Future[bool]":
        """verify() on the executor; the check already in flight for these credentials if
        there is one. RuntimeError when the executor is shut down."""
        key = self._key(user, password)
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight
            flight = self._flights[key] = executor.submit(self.verify, user, password)
        # outside the lock: a check already done calls back at once, and the callback locks
        flight.add_done_callback(lambda done: self._landed(key, done))
        return flight

    def _landed(self, key: bytes, flight: "Future[bool]") -> None:
        # its answer is in the caches now (verify stored it before returning): later callers
        # read it there, so the finished check leaves the table
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]

    def verify(self, user: str, password: str) -> bool:
        """The bcrypt check (slow: callers run it off the event loop, a few at a time)."""
        if not self.users:
            return False
        import bcrypt

        hashed = self.users.get(user)
        stored = hashed if hashed is not None else self.dummy
        started = time.monotonic()
        try:
            ok = bcrypt.checkpw(password.encode(), stored)
        except Exception:  # bcrypt refuses (too long, bad encoding): the same "no" for every user
            ok = False
        ok = ok and hashed is not None
        elapsed = time.monotonic() - started
        if bcrypt_cost(stored) == self._max_cost:
            self._slowest = elapsed
        elif self._slowest == 0.0:
            # a user with a cheaper hash answers as late as the slowest one (and as an unknown
            # user): not measured yet, so pay the slowest check itself once
            started = time.monotonic()
            bcrypt.checkpw(b"resmon-pad", self.dummy)
            self._slowest = time.monotonic() - started
        elif self._slowest > elapsed:
            time.sleep(self._slowest - elapsed)
        key = self._key(user, password)
        with self._lock:
            if ok:
                self._ok[key] = user
                while len(self._ok) > self.MAX_CACHED:
                    self._ok.popitem(last=False)
            else:
                self._failed[key] = time.monotonic() + self.FAILURE_TTL
                self._failed.move_to_end(key)
                while len(self._failed) > self.MAX_CACHED:
                    self._failed.popitem(last=False)
        return ok

    def check(self, user: str, password: str) -> bool:
        known = self.cached(user, password)
        return known if known is not None else self.verify(user, password)
