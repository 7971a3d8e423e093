"""All contact with the gpu-tracker package lives here (it is an optional extra).

gpu-tracker's public Tracker only yields whole-run maxima and writes a pickle into the
working directory, so this uses its per-GPU queriers (private API, pinned to
gpu-tracker>=5.0.1,<6; tests/test_gpu_tracker.py fails loudly if they move). Three of
their weaknesses are mended here, by slotting a class between the vendor querier and
gpu-tracker's base class so its own argv and CSV parsing still run:

- its subprocess calls have no timeout: ours have one and kill the whole process group;
- it merges stderr into the CSV: ours keeps stderr apart;
- an '[N/A]' cell crashes its int()/float() parsing: ours turns it into -1 first, which
  the backend reads as "absent".

Its AMD querier stacks @classmethod on @property, which Python 3.13 no longer chains; a
plain class-level id -> UUID dict, filled by the same 'amd-smi list' query, replaces it.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
from gpu_tracker import _helper_classes as gt  # private: see the module docstring

VENDOR_COMMANDS: dict[str, str] = {"nvidia": "nvidia-smi", "amd": "amd-smi"}
_NA_WORDS = ("[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]", "[GPU is lost]")


class CliError(Exception):
    """The vendor CLI failed, hung past the deadline, or printed what cannot be parsed."""


@dataclass(frozen=True, slots=True)
class CliGpu:
    """One row of the vendor CLI, in the CLI's units (MiB, percent); None where absent."""

    uuid: str
    memory_total_mib: float | None
    memory_used_mib: float | None
    utilization_percent: float | None


def run_bounded(argv: list[str], timeout: float) -> str:
    """Run argv, return stdout. On timeout the whole process group is killed, so a hung
    CLI (and anything it started) never outlives the refresh."""
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:  # not installed, not executable
        raise CliError(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.01))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise CliError(f"{' '.join(argv)} did not answer within {timeout:.1f}s; killed") from None
    if proc.returncode != 0:
        detail = (err or out).decode(errors="replace").strip().splitlines()
        raise CliError(f"{' '.join(argv)} exited with {proc.returncode}" + (f": {detail[-1]}" if detail else ""))
    return out.decode(errors="replace")


def _blank_na(text: str) -> str:
    """'[N/A]' and friends become -1 (with the column's unit, so gpu-tracker's parsing
    still sees a string), a value no real reading has."""
    lines = text.splitlines()
    if not lines:
        return text
    units = [" MiB" if "[MiB]" in h else " %" if "[%]" in h else "" for h in lines[0].split(",")]
    out = [lines[0]]
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        out.append(", ".join(
            f"-1{units[i] if i < len(units) else ''}" if c in _NA_WORDS else c for i, c in enumerate(cells)
        ))
    return "\n".join(out) + "\n"


class _Bounded(gt._GPUQuerier):
    """Replaces gpu-tracker's raw query (subprocess + read_csv) with a bounded one."""

    deadline: float = 0.0  # monotonic; set by query() before each call

    @classmethod
    def _query_gpu(cls, *args: str, **_: Any) -> pd.DataFrame:
        text = run_bounded([cls.command, *args], cls.deadline - time.monotonic())
        frame = pd.read_csv(io.StringIO(_blank_na(text)), skipinitialspace=True)
        return frame.map(lambda value: value.strip() if type(value) is str else value)


class _Nvidia(gt._NvidiaQuerier, _Bounded):
    pass


class _AMD(gt._AMDQuerier, _Bounded):
    _id_to_uuid: dict[Any, str] = {}  # shadows upstream's classmethod-property (broken on 3.13)

    @classmethod
    def refresh_ids(cls) -> None:
        frame = super(gt._AMDQuerier, cls)._query_gpu("list", "--csv")  # _Bounded's, not upstream's
        cls._id_to_uuid = dict(zip(frame.gpu, frame.gpu_uuid))


_QUERIERS: dict[str, type[_Bounded]] = {"nvidia": _Nvidia, "amd": _AMD}


def available(vendor: str, timeout: float) -> str | None:
    """None when the vendor CLI answers; else why not."""
    try:
        run_bounded([VENDOR_COMMANDS[vendor]], timeout)
    except CliError as exc:
        return str(exc)
    return None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number or number < 0 else number


def query(vendor: str, timeout: float, totals: dict[str, float | None] | None) -> tuple[list[CliGpu], dict[str, float | None]]:
    """Current used memory and utilization per GPU, in CLI row order, with the totals
    (static; pass the previous result to skip re-reading them while the UUIDs match)."""
    querier = _QUERIERS[vendor]
    querier.deadline = time.monotonic() + timeout
    try:
        if vendor == "amd" and not _AMD._id_to_uuid:
            _AMD.refresh_ids()
        try:
            current = querier.ram_and_utilization()
        except KeyError:  # an AMD id the cached map does not know: GPUs changed
            if vendor != "amd":
                raise
            _AMD.refresh_ids()
            current = querier.ram_and_utilization()
        uuids = [str(u) for u in current["uuid"]]
        if totals is None or set(totals) != set(uuids):
            static = querier.static_info()
            totals = {str(u): _number(r) for u, r in zip(static["uuid"], static["ram"])}
    except CliError:
        raise
    except Exception as exc:  # pandas, KeyError, ValueError, TypeError, AttributeError, ...
        raise CliError(f"{VENDOR_COMMANDS[vendor]} output not understood: {exc.__class__.__name__}: {exc}") from None
    gpus = [
        CliGpu(uuid=u, memory_total_mib=totals.get(u), memory_used_mib=_number(r), utilization_percent=_number(p))
        for u, r, p in zip(uuids, current["ram"], current["utilization_percent"])
    ]
    return gpus, totals
