"""Command line: Go-exporter style flags, each also settable as RESMON_<NAME>."""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence

from .backends.base import BACKEND_CHOICES, BackendError
from .config import COLLECTORS, GROUP_BY, POD_RESOURCES_SOCKET, Config, FamilyFilter
from .version import __version__

PROG = "resmon-exporter"
ENV_PREFIX = "RESMON_"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_HOUR = 3600.0


class UsageError(Exception):
    """A bad flag, value or environment variable: one line, exit code 2."""


def parse_duration(text: str) -> float:
    """Go durations ('500ms', '1m30s') or plain seconds ('2.5'), returned in seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(value) or not value:
            raise ValueError(f"invalid duration {text!r} (examples: 500ms, 1s, 2m)") from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ValueError(f"invalid duration {text!r}: must be zero or more")
    return seconds


def _duration(maximum: float, positive: bool = False) -> Callable[[str], float]:
    """A duration flag bounded above: a value like 1e10 s would overflow the thread waits
    and make every scrape fail, so it is refused at start."""

    def check(text: str) -> float:
        seconds = parse_duration(text)
        if positive and seconds <= 0:
            raise ValueError(f"invalid duration {text!r}: must be more than zero")
        if seconds > maximum:
            raise ValueError(f"invalid duration {text!r}: at most {_go_duration(maximum)}")
        return seconds

    return check


def _go_duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _telemetry_path(text: str) -> str:
    # printable ASCII only, no %, ? or #: requests are routed on the decoded path, and a
    # path a client cannot spell in a request line is a path nobody can scrape
    if not text.startswith("/") or text in ("/", "/-/healthy", "/-/ready") or any(
        not 0x21 <= ord(c) <= 0x7E or c in "%?#" for c in text
    ):
        raise ValueError(
            f"invalid telemetry path {text!r}: must start with /, be printable ASCII without %, ? or #, "
            "and not be /, /-/healthy or /-/ready"
        )
    return text


def _listen_address(text: str) -> str:
    from .http.routes import parse_listen_address

    parse_listen_address(text)
    return text


def _whole_number(minimum: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        digits = text.strip()
        if not digits.isdecimal() or not digits.isascii() or int(digits) < minimum:
            raise ValueError(f"invalid number {text!r}: want a whole number, {minimum} or more")
        return int(digits)

    return check


def _socket_path(text: str) -> str:
    # gRPC reads a comma in a unix target as a list of addresses
    if "," in text:
        raise ValueError(f"invalid socket path {text!r}: gRPC cannot connect to a path with a comma")
    return text


def _family_pattern(flag: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text:
            FamilyFilter(**{flag: text})  # compiles it: a bad pattern is an error at start
        return text

    return check


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid boolean {text!r} (use true or false)")


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in options:
            raise ValueError(f"invalid choice {text!r} (choose from {', '.join(options)})")
        return text

    return check


@dataclass(frozen=True)
class Flag:
    name: str  # without the leading dashes, e.g. "web.listen-address"
    default: Any
    convert: Callable[[str], Any]
    help: str
    boolean: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace(".", "_").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _collector(name: str) -> Flag:
    """--[no-]collector.NAME, its default and help from config.COLLECTORS (the one list)."""
    spec = next(c for c in COLLECTORS if c.name == name)
    return Flag(f"collector.{name}", spec.default, _bool, spec.help, boolean=True)


FLAGS: tuple[Flag, ...] = (
    Flag("web.listen-address", ":9636", _listen_address, "Address to listen on, host:port (':9636' = all interfaces)."),
    Flag("web.telemetry-path", "/metrics", _telemetry_path, "Path under which to expose metrics."),
    Flag("web.config.file", "", str, "exporter-toolkit web config (TLS, basic auth, headers); empty = plain HTTP."),
    Flag("web.max-requests", 40, _whole_number(0), "Most scrapes served at once; 503 beyond (0 = no limit)."),
    Flag("web.read-header-timeout", 10.0, _duration(_HOUR, positive=True), "Time a client has to send a request head."),
    Flag("web.idle-timeout", 120.0, _duration(_HOUR, positive=True), "Close kept-alive connections idle this long."),
    Flag("web.timeout-offset", 0.5, _duration(60.0), "Subtracted from Prometheus' scrape timeout to get the refresh deadline."),
    Flag("gpu.backend", "auto", _choice(BACKEND_CHOICES), "GPU backend: auto, nvml, amdgpu, intel, gpu-tracker or none."),
    Flag("collect.cache-ttl", 1.0, _duration(_HOUR), "Reuse a snapshot younger than this (e.g. 1s, 500ms; 0 = never)."),
    Flag("collect.timeout", 5.0, _duration(600.0, positive=True), "Longest a refresh may wait for the GPU before reporting it down."),
    Flag("collect.slow-interval", 30.0, _duration(_HOUR), "Read values that change rarely (ECC, remapped rows, NVLink state and errors, PCIe link, MIG layout, UUID) this often (0 = every refresh)."),
    Flag("metrics.include", "", _family_pattern("include"), "Serve only the families whose whole name matches this regular expression (empty = all); resmon_gpu_up, resmon_gpu_info and the collector status are always served."),
    Flag("metrics.exclude", "", _family_pattern("exclude"), "Leave out the families whose whole name matches this regular expression; their NVML calls are not made where no other family needs them."),
    _collector("gpu"),
    _collector("health"),
    _collector("xid"),
    _collector("nvlink"),
    _collector("profiling"),
    _collector("mig"),
    _collector("processes"),
    Flag("collector.processes.group-by", "process", _choice(GROUP_BY), "One series per process, or per container (summed; no pid, process, user labels)."),
    Flag("collector.processes.max-per-gpu", 64, _whole_number(1), "Most process series per GPU and family, the largest by memory (and allocation series per GPU)."),
    Flag("path.procfs", "/proc", str, "procfs mount point: the host's /proc when running in a container (NVML reports host PIDs)."),
    Flag("path.sysfs", "/sys", str, "sysfs mount point: where the amdgpu and intel backends find the cards (the host's /sys in a container)."),
    _collector("kubernetes"),
    Flag("kubernetes.pod-resources-socket", POD_RESOURCES_SOCKET, _socket_path, "The kubelet's PodResources API socket."),
    Flag("kubernetes.cache-ttl", 5.0, _duration(_HOUR), "Reuse the kubelet's List answer this long."),
    Flag("kubernetes.pod-logs-dir", "/var/log/pods", str, "The kubelet's pod log directory: pod UID to namespace and name, for process series."),
    Flag("kubernetes.container-logs-dir", "/var/log/containers", str, "The kubelet's container log links: container id to its name, for process series."),
    _collector("host"),
    Flag("log.level", "info", _choice(("debug", "info", "warn", "error")), "Log level: debug, info, warn, error."),
    Flag("log.format", "logfmt", _choice(("logfmt", "json")), "Log format: logfmt or json."),
)


class _BooleanFlag(argparse.BooleanOptionalAction):
    """`--X`, `--no-X`, and `--X=true|false` (case-insensitive): users of Go exporters write
    the value out, and argparse's own action refuses it as an "ignored explicit argument"."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"  # one optional value, after = (or as the next word)
        self.metavar = "true|false"

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        negated = option_string is not None and option_string.startswith("--no-")
        if values is None:
            setattr(namespace, self.dest, not negated)
            return
        if negated:
            raise argparse.ArgumentError(self, f"{option_string} takes no value (use --{option_string[5:]}=false)")
        lowered = values.strip().lower()
        if lowered not in ("true", "false"):
            raise argparse.ArgumentError(self, f"invalid boolean {values!r} (use true or false)")
        setattr(namespace, self.dest, lowered == "true")

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class _HelpFormatter(argparse.HelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _BooleanFlag):  # "--X[=true|false], --no-X", not a metavar on both
            return f"{action.option_strings[0]}[=true|false], {', '.join(action.option_strings[1:])}"
        return super()._format_action_invocation(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _converter(flag: Flag) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return flag.convert(text)
        except ValueError as exc:
            # argparse shows ArgumentTypeError's text as it is
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _shown(default: Any) -> str:
    return f"{default:g}s" if isinstance(default, float) else str(default)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Prometheus exporter for NVIDIA GPU (NVML), AMD GPU (amdgpu sysfs), Intel GPU (xe/i915 sysfs) and host resources.",
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    for flag in FLAGS:
        help_text = f"{flag.help} [env {flag.env}]"
        if flag.boolean:
            # a switch has no value to show, so say whether it is on unless given
            parser.add_argument(
                f"--{flag.name}", dest=flag.dest, action=_BooleanFlag,
                help=f"{help_text} (default {'on' if flag.default else 'off'})",
            )
        else:
            parser.add_argument(
                f"--{flag.name}", dest=flag.dest, type=_converter(flag), metavar="VALUE",
                help=f"{help_text} (default {_shown(flag.default)})",
            )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__} (python {platform.python_version()})")
    return parser


def parse_config(argv: Sequence[str] | None, environ: dict[str, str] | None = None) -> tuple[Config, list[str]]:
    """Flags override environment variables, which override defaults. Returns the config
    and warnings (unknown RESMON_ variables). The command line is parsed first, so --help
    and --version work whatever the environment holds, and a bad RESMON_ value is an error
    only when no flag overrides it."""
    env = os.environ if environ is None else environ
    namespace = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    for flag in FLAGS:
        given = getattr(namespace, flag.dest)
        if given is not None:
            values[flag.dest] = given
        elif flag.env in env:
            try:
                values[flag.dest] = flag.convert(env[flag.env])
            except ValueError as exc:
                raise UsageError(f"{flag.env}: {exc}") from None
        else:
            values[flag.dest] = flag.default
    known = {flag.env for flag in FLAGS}
    warnings = [
        f"ignoring unknown environment variable {name}" for name in sorted(env) if name.startswith(ENV_PREFIX) and name not in known
    ]
    return Config(**values), warnings


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, warnings = parse_config(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc} (see --help)", file=sys.stderr)
        return 2
    return run(config, warnings)


def run(config: Config, warnings: Sequence[str] = ()) -> int:
    # Imported here so --help and --version stay fast and touch no GPU library.
    from pathlib import Path

    from . import logs
    from .http.serve import serve
    from .http.web_config import WebConfigError, WebConfigSource
    from .monitor import ResourceMonitor

    log = logs.setup(config.log_level, config.log_format)
    for warning in warnings:
        log.warning(warning)
    try:
        web = WebConfigSource(Path(config.web_config_file) if config.web_config_file else None, log)
    except WebConfigError as exc:
        print(f"{PROG}: error: --web.config.file={config.web_config_file}: {exc}", file=sys.stderr)
        return 2
    if config.collector_processes and config.collector_gpu and not Path(config.path_procfs, "self").is_dir() and not Path(config.path_procfs, "1").is_dir():
        print(f"{PROG}: error: --path.procfs={config.path_procfs}: not a procfs mount (no self or 1 in it)", file=sys.stderr)
        return 2
    try:
        monitor = ResourceMonitor(options=config.monitor_options(), logger=log)
    except BackendError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2

    monitor.start()  # start-up probing and the first read, outside any scrape deadline
    # What start-up made (modules, the flag tables, the libraries' own objects: about 33000
    # objects) lives as long as the process: frozen out of the cyclic GC, so its full
    # collections, which a scrape of 64 GPUs sets off about one in 20 times, scan only what
    # the exporter made since (about 0.7 ms instead of 8). The library API leaves an
    # application's heap alone: this is the CLI's process.
    gc.collect()
    gc.freeze()
    try:
        return serve(config, monitor, web, log)
    finally:
        # after the 8 s HTTP grace: the whole stop stays under docker stop's 10 s; release:
        # the XID watcher's last wait ends and it frees its set and shuts NVML down before exit
        monitor.close(drain=1.0, release=1.0)

