"""Test rig: build the fake libnvidia-ml.so.1, describe machines for it, run the real exporter.

The fake (fake_nvml/fake_nvml.c) reads the scenario file named by $FAKE_NVML_SCENARIO and
re-reads it whenever it changes. Keys (all optional):

    init=<rc>                      return code of nvmlInit (9 = driver not loaded)
    count=<n>                      number of GPUs (default 1)
    driver_version=, nvml_version=, cuda_version=
    rc.<symbol>=<rc>               return code of an NVML symbol for every device
    delay_ms.<symbol>=<ms>         sleep before answering (a wedged driver)
    delay_us.<symbol>=<us>         the same in microseconds (simulated driver latency); the
                                   symbol "all" (delay_ms.all, delay_us.all) delays every call
    gpu.<i>.<field>=<value>        name uuid pci_bus_id serial memory_total memory_used
                                   memory_reserved util_gpu util_memory temperature power_mw
                                   power_limit_mw energy_mj fan num_fans pstate
                                   clocks_event_reasons clock.<graphics|sm|memory|video>
                                   max_clock.<...> processes=pid:bytes,... graphics_processes=...
    gpu.<i>.rc.<symbol>=<rc>       per-device return code (rc.all: every call on that device;
                                   rc.nvmlDeviceGetHandleByIndex_v2: lost at handle)
    gpu.<i>.delay_ms.<symbol>=<ms>, gpu.<i>.delay_us.<symbol>=<us> (symbol "all" as above)

Health keys (issue 10; this list is their contract), all per GPU as gpu.<i>.<key>.
Every feature answers NOT_SUPPORTED (3) until its keys are set, so old scenarios are unchanged:

    ecc=none|on|off                nvmlDeviceGetEccMode current 1/0 (none: NOT_SUPPORTED); the
                                   counters of nvmlDeviceGetTotalEccErrors answer only when on
    ecc_pending=0|1                (default: same as current)
    ecc.<corrected|uncorrected>.<volatile|aggregate>=N   (default 0)
    page_retirement=0|1            nvmlDeviceGetRetiredPages, _v2, ...PendingStatus
    retired.multiple_single_bit=N, retired.double_bit=N, retired_pending=0|1
                                   page j of cause c: address ((c+1) << 36) | (j << 12),
                                   _v2 timestamp 1700000000 + j; size protocol as NVML
    row_remapping=0|1              nvmlDeviceGetRemappedRows
    remapped.correctable=N, remapped.uncorrectable=N, remap_pending=0|1, remap_failed=0|1
    nvlinks=N                      (0: NvLinkState / NvLinkErrorCounter NOT_SUPPORTED; a link
                                   >= N: INVALID_ARGUMENT); field 91 answers N, also when 0
    nvlink.<L>.active=0|1          (default 1)
    nvlink.<L>.tx_kib=N, nvlink.<L>.rx_kib=N   fields 138/140 (TX) and 139/141 (RX), scopeId L,
                                   scopeId 0xFFFFFFFF = the sum over links (link >= N: that
                                   entry INVALID_ARGUMENT)
    nvlink.<L>.errors.<replay|recovery|crc_flit|crc_data|ecc_data>=N   counters 0..4
    pcie_gen=, pcie_gen_max=       CurrPcieLinkGeneration; Max- and GpuMaxPcieLinkGeneration
    pcie_width=, pcie_width_max=, pcie_replays=   (each unset: that call NOT_SUPPORTED)
    field.<id>=<int>               nvmlDeviceGetFieldValues, every scopeId; UINT (valueType 1)
                                   for ids 1, 2, 31, 82, 91, 94, 142-145, 165, 185, 186, 190,
                                   230, DOUBLE (0) for 308, ULONGLONG (3) for the others
    field.<id>@<scope>=<int>       that scopeId only; wins over the plain key (so do the
                                   @<scope> forms of the three keys below)
    field_double.<id>=<float>      stored in dVal, valueType DOUBLE (0)
    field_type.<id>=<t>            the reported valueType only (r545: uiVal labelled DOUBLE)
    field_rc.<id>=<rc>             that entry's own nvmlReturn
                                   These keys win over what follows. Without them an id
                                   modeled on a direct call answers what that call answers on
                                   the same state, its rc.<symbol> / gpu.<i>.rc.<symbol>
                                   override too (as the entry's nvmlReturn; not its delay, nor
                                   a trace line): 1/2 ECC current/pending (GetEccMode); 3/4/5/6
                                   SBE/DBE volatile, SBE/DBE aggregate (GetTotalEccErrors);
                                   29/30 retired pages of cause 0/1 (GetRetiredPages), 31 pending
                                   (...PendingStatus); 142-145 remapped cor/unc/pending/failure
                                   (GetRemappedRows); 165 link state, 161/162/163 replay/
                                   recovery/crc_flit, scopeId = link (GetNvLinkState /
                                   GetNvLinkErrorCounter); the legacy per-link counters, scopeId
                                   ignored: crc_flit 32-37 (links 0-5) and 96-101 (6-11),
                                   crc_data 39-44 / 102-107, replay 46-51 / 108-113, recovery
                                   53-58 / 114-119; 83 energy_mj (GetTotalEnergyConsumption);
                                   185/186 power_mw (GetPowerUsage), 190 power_limit_mw
                                   (GetEnforcedPowerLimit), scopeId 0 only; 94 pcie_replays
                                   (GetPcieReplayCounter); 308 temperature as a DOUBLE
                                   (GetTemperatureV; not in the old-driver build). 91 and 138-141 come from the nvlink
                                   keys. Any other id: NOT_SUPPORTED. The call returns SUCCESS
                                   (NULL array or count <= 0: INVALID_ARGUMENT); every entry
                                   gets timestamp = now (µs since the epoch), latencyUsec 0.
    violation.<policy>=<ns>        nvmlDeviceGetViolationStatus, policy 0..5 (unset: that
                                   policy NOT_SUPPORTED); referenceTime = now (µs, epoch)
    samples.period_ms=<ms>         nvmlDeviceGetSamples for types 1 GPU, 2 MEMORY, 3 ENC, 4 DEC
                                   (unset: NOT_SUPPORTED for every type; other types always)
    samples.capacity=N             (default 100) the ring keeps the latest N samples
    samples.rc.<gpu|memory|encoder|decoder>=<rc>   that sampling type alone answers rc (e.g.
                                   3: an encoder without samples beside a sampled decoder)
    samples.<gpu|memory|encoder|decoder>=v0,v1,...   percent, cycled by sample number k
                                   (default: util_gpu / util_memory / encoder_util / decoder_util)
                                   Sample k: timeStamp k * period_ms * 1000 (µs, CLOCK_MONOTONIC),
                                   value pattern[k mod len], valueType UINT. Returned: lastSeen <
                                   ts <= now, at most capacity, oldest first; NULL buffer: SUCCESS
                                   with the count, NOT_FOUND (6) when none is newer than lastSeen.
    xid_supported=0|1, global xid_events=<uuid>:<code>,...   event sets (fake_events.c)

Process keys (issue 11; this list is their contract), per GPU as gpu.<i>.<key>.
Without them every call answers as before:

    processes=pid:bytes,...        nvmlDevice{Compute,Graphics}RunningProcesses_v2/_v3, at most
    graphics_processes=...         512 entries a list (more: warned about, the first 512 kept);
                                   pid:na = usedGpuMemory 0xFFFFFFFFFFFFFFFF (pynvml: None)
    process_util=pid:sm:mem:enc:dec[@ts_us],...   nvmlDeviceGetProcessUtilization samples (at
                                   most 1024), in this order; several may name one pid; values
                                   as given (may exceed 100). No @ts: timeStamp = the scenario's
                                   load time (µs since the epoch, CLOCK_REALTIME) + the entry's
                                   position (0, 1, ...); a later load always stamps past every
                                   stamp an earlier one handed out, so a rewrite answers newer
                                   samples. Returned: timeStamp > lastSeenTimeStamp only; none
                                   (also unset): NOT_FOUND (6), count 0; NULL buffer or a count
                                   too small: INSUFFICIENT_SIZE (7) with the count needed; a
                                   malformed entry: warned about, the key ignored.
    process_util_supported=0|1     (default 1) 0: NOT_SUPPORTED (3), as on a MIG-enabled GPU
    mig_uuids=MIG-a,MIG-b,...      MIG on (also when empty: no instance), at most 8 devices.
                                   GetMigMode [1, 1]; GetMaxMigDeviceCount = the number listed;
                                   GetMigDeviceHandleByIndex(parent, i): a MIG handle for i <
                                   that number, else NOT_FOUND; on the MIG handle GetUUID = its
                                   uuid, IsMigDeviceHandle 1, GetDeviceHandleFromMigDeviceHandle
                                   = the parent's GetHandleByIndex handle; every other call
                                   INVALID_ARGUMENT (2), so is a MIG handle whose device a reload
                                   took away. MIG calls are traced and overridden (rc.*, delay_ms.*)
                                   as the parent GPU. Unset: GetMigMode, GetMaxMigDeviceCount and
                                   GetMigDeviceHandleByIndex NOT_SUPPORTED, IsMigDeviceHandle 0.

GPM and MIG keys (issue 13), per GPU as gpu.<i>.<key>. Without them every call answers as before
(GPM support 0; the old-driver build exports no nvmlGpm* symbol):

    gpm=0|1                        nvmlGpmQueryDeviceSupport isSupportedDevice (SUCCESS either way);
                                   0: nvmlGpmSampleGet / MigSampleGet NOT_SUPPORTED
    gpm.<id>=<value>|nan|window    GPM metric <id> (< 128) of the whole GPU, percent or MiB/s: the
                                   sample counters grow at value per second (in integer
                                   milli-units), so MetricsGet answers exactly <value> over any
                                   window while it is constant, and the time-weighted mix across a
                                   change (counters run at the old rates until the reload). nan:
                                   NaN; window: the window itself in seconds. Unset: that entry
                                   NOT_SUPPORTED
    gpm_rc.<id>=<rc>               that entry's own nvmlReturn
    gi.<gi>.gpm.<id>=..., gi.<gi>.gpm_rc.<id>=...   the same for GPU instance <gi> (< 16), read by
                                   nvmlGpmMigSampleGet(parent, gi): NOT_FOUND unless a present MIG
                                   device belongs to <gi>. MetricsGet: INVALID_ARGUMENT for samples
                                   of different GPUs or instances, no time between them, a freed
                                   or foreign sample, version != 1 or numMetrics > 477
                                   Samples: calloc'd by nvmlGpmSampleAlloc, counted; one still
                                   allocated at the last nvmlShutdown is reported on stderr
                                   ("fake-nvml: N GPM samples still allocated at nvmlShutdown");
                                   one used by SampleGet / MigSampleGet / MetricsGet / SampleFree
                                   after the last nvmlShutdown since its allocation is refused
                                   (INVALID_ARGUMENT) and reported ("fake-nvml: GPM sample used
                                   after free: ...")
    mig_devices=<gi>:<ci>:<profile>:<uuid>:<mem_total>:<mem_used>|empty|invalid,...
                                   MIG on with full MIG devices (at most 8 slots): MaxMigDeviceCount
                                   = the slots, HandleByIndex on "empty" NOT_FOUND, on "invalid"
                                   INVALID_ARGUMENT; on a MIG handle GetGpuInstanceId /
                                   GetComputeInstanceId the ids, GetName "<parent name> MIG
                                   <profile>", GetMemoryInfo (v1, v2: reserved 0) its memory,
                                   GetBAR1MemoryInfo 32 MiB, GetUUID the uuid; other calls as for
                                   mig_uuids. The parent refuses what MIG mode refuses:
                                   UtilizationRates, Encoder/DecoderUtilization, GetSamples,
                                   GetProcessUtilization NOT_SUPPORTED (mig_uuids alone: unchanged)
                                   An entry may end in :<gi profile id>:<placement start>[:<size>]
                                   (size 1 by default): GetGpuInstanceById(parent, gi) a GPU
                                   instance handle (NOT_FOUND for an id no slot has), on it
                                   GpuInstanceGetInfo those (NOT_SUPPORTED without them;
                                   INVALID_ARGUMENT once a reload took the instance away)
    minor=<n>                      GetMinorNumber (default: the index)
    mig_mode=<current>:<pending>   GetMigMode answer (default 1:1 with mig_uuids / mig_devices;
                                   alone: a MIG-capable GPU, 0:0 = MIG off, no MIG device)

Boards built from these keys: tests/scenarios.py hopper_board, volta_board, consumer_board,
health_machine, profiling_machine (the exact values are constants there).

With $FAKE_NVML_TRACE set, every call appends "<symbol> <device index>" to that file.
$FAKE_NVML_EVENT_POLL_MS (default 10): how often a blocked nvmlEventSetWait re-reads the
scenario; a value of at least the wait's timeout makes it block like a real driver.
"""

from __future__ import annotations

import collections
import http.client
import importlib.util
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from prometheus_client.parser import text_string_to_metric_families

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKE_SOURCE = TESTS / "fake_nvml" / "fake_nvml.c"

GIB = 1024**3
MIB = 1024**2


def nvml_header_dir() -> Path | None:
    """Include directory of the official nvml.h from the nvidia-nvml-dev wheel, if installed."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for header in sorted(Path(location).glob("*/include/nvml.h")):
            return header.parent
    return None


def build_fake(out_dir: Path, *, old_driver: bool = False, header_dir: Path | None = None) -> Path:
    """Compile the fake into out_dir/libnvidia-ml.so.1 and return out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"]
    if old_driver:
        flags.append("-DFAKE_OLD_DRIVER")
    if header_dir is not None:
        flags += ["-DFAKE_WITH_NVML_H", f"-I{header_dir}"]
    cmd = ["gcc", *flags, "-o", str(out_dir / "libnvidia-ml.so.1"), str(FAKE_SOURCE), "-lpthread"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed:\n{' '.join(cmd)}\n{result.stderr}")
    return out_dir


class Scenario:
    """The machine the fake pretends to be. write() replaces it atomically (rename), so a
    running exporter sees either the old or the new machine, never half of one."""

    def __init__(self, path: Path, values: dict[str, Any] | None = None) -> None:
        self.path = path
        self.values: dict[str, Any] = {}
        self.write(values or {})

    def write(self, values: dict[str, Any]) -> None:
        self.values = dict(values)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(f"{key}={value}\n" for key, value in self.values.items()))
        os.replace(tmp, self.path)

    def update(self, **changes: Any) -> None:
        """update(**{"gpu.1.rc.all": 15}); a value of None removes the key."""
        values = dict(self.values)
        for key, value in changes.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        self.write(values)


def gpu_keys(index: int, **fields: Any) -> dict[str, Any]:
    return {f"gpu.{index}.{key.replace('__', '.')}": value for key, value in fields.items()}


class Trace:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[str, int]]:
        if not self.path.exists():
            return []
        out = []
        text = self.path.read_text()
        # the fake may be writing a line as it is read (a read does not wait for a write):
        # a last line without its newline is not yet complete, and is left for the next read
        for line in text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]:
            symbol, _, index = line.partition(" ")
            out.append((symbol, int(index)))
        return out

    def count(self, symbol: str, device: int | None = None) -> int:
        return sum(1 for s, i in self.lines() if s == symbol and (device is None or i == device))

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(s for s, _ in self.lines())

    def clear(self) -> None:
        self.path.write_text("")


class Scrape:
    """A parsed /metrics response."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
        for family in self.families.values():
            for sample in family.samples:
                self.samples[sample.name].append((dict(sample.labels), sample.value))

    def series(self, name: str, /, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(l, v) for l, v in self.samples.get(name, []) if all(l.get(k) == w for k, w in labels.items())]

    def value(self, name: str, /, **labels: str) -> float:
        found = self.series(name, **labels)
        if len(found) != 1:
            raise AssertionError(f"{name}{labels}: expected one series, found {found}")
        return found[0][1]

    def has(self, name: str, /, **labels: str) -> bool:
        return bool(self.series(name, **labels))


class Exporter:
    """The real CLI as a subprocess on a loopback port picked by the kernel."""

    def __init__(self, args: Iterable[str], env: dict[str, str], command: list[str] | None = None) -> None:
        cmd = (command or [sys.executable, "-m", "resmon_exporter"]) + ["--web.listen-address=127.0.0.1:0", *args]
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr_lines: list[str] = []
        self.port: int | None = None
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            match = re.search(r"msg=listening address=\S*:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self._listening.set()
        self._listening.set()

    @property
    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    def wait_listening(self, timeout: float = 30.0) -> "Exporter":
        if not self._listening.wait(timeout) or self.port is None:
            raise AssertionError(f"exporter did not start listening; stderr:\n{self.stderr}")
        return self

    def request(
        self, path: str, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 30.0
    ) -> tuple[int, dict[str, str], bytes]:
        assert self.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def scrape(self, path: str = "/metrics") -> Scrape:
        status, _, body = self.request(path)
        assert status == 200, (status, body[:300])
        return Scrape(body.decode())

    def wait_for(self, predicate: Any, timeout: float = 20.0, interval: float = 0.2) -> Scrape:
        """Scrape until predicate(scrape) is true; bounded."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.scrape()
            if predicate(last):
                return last
            time.sleep(interval)
        raise AssertionError(f"condition not met within {timeout}s; last scrape:\n{last.text if last else ''}")

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.request("/-/ready")[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError("exporter never became ready")

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        return self.proc.returncode


def nvml_env(lib_dir: Path | None, scenario: Scenario | None, trace: Trace | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESMON_", "FAKE_NVML_"))}
    env["LD_LIBRARY_PATH"] = str(lib_dir) if lib_dir is not None else ""
    if scenario is not None:
        env["FAKE_NVML_SCENARIO"] = str(scenario.path)
    if trace is not None:
        env["FAKE_NVML_TRACE"] = str(trace.path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def sysfs_exporters(tmp_path: Path) -> Iterator[Callable[..., "Exporter"]]:
    """The body of the sysfs backends' exporter fixtures (amdgpu, intel): yields
    start(*flags, root=sysfs) -> a ready exporter on that fake sysfs with NVML absent (an
    empty LD_LIBRARY_PATH directory), the kubernetes collector off unless a --kubernetes.
    flag is given; every exporter started is stopped at the end."""
    started: list[Exporter] = []
    no_nvml = tmp_path / "no-nvml"
    no_nvml.mkdir()

    def start(*flags: str, root: Path) -> Exporter:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESMON_")}
        env.update(LD_LIBRARY_PATH=str(no_nvml), PYTHONUNBUFFERED="1")
        kube = [] if any(f.startswith("--kubernetes.") for f in flags) else ["--no-collector.kubernetes"]
        exporter = Exporter([f"--path.sysfs={root}", *kube, *flags], env)
        started.append(exporter)
        exporter.wait_listening()
        exporter.wait_ready()
        return exporter

    yield start
    for e in started:
        e.stop()


_IN_PROCESS: dict[str, Path] = {}


def load_in_process(lib_dir: Path, trace_path: Path) -> Trace:
    """Load the fake into this (pytest) process, so pynvml runs for real against it here.
    glibc's dlopen("libnvidia-ml.so.1"), which pynvml's nvmlInit does, returns an object
    already loaded under that soname, so loading the fake first by full path is enough.
    Once per process: the first lib_dir and trace path win (the fake opens its trace once)."""
    import ctypes

    quiesce()
    if "lib" not in _IN_PROCESS:
        os.environ["FAKE_NVML_TRACE"] = str(trace_path)
        ctypes.CDLL(str(lib_dir / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
        _IN_PROCESS["lib"], _IN_PROCESS["trace"] = lib_dir, trace_path
    return Trace(_IN_PROCESS["trace"])


def quiesce(timeout: float = 10.0) -> None:
    """Let monitors that earlier in-process tests dropped finish closing (their GPU and XID
    threads end and shut NVML down) before a test counts calls in the shared trace."""
    import gc

    gc.collect()  # runs the finalizers of dropped monitors
    deadline = time.monotonic() + timeout
    while any(t.name in ("resmon-gpu", "resmon-xid") and t.is_alive() for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise AssertionError("resmon threads of an earlier test are still running")
        time.sleep(0.02)


class Records(logging.Handler):
    """Keeps every log record, for tests that assert on what was logged and at which level."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]
