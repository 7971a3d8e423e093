"""The host collector (exporter/host.py, which reads through psutil) against an oracle that is
not psutil: /proc/stat, /proc/meminfo and /proc/loadavg read directly.

Host values move while we read, so each exporter value is bracketed by an oracle read just
before and just after it. Counters only grow, so before <= value <= after. Gauges (available
memory, load) move both ways, so those are retried until the two bracket reads agree: a
bounded number of tries, each a few microseconds apart, which a quiet CI machine always gets.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, TypeVar

from resmon_exporter.host import HostReader

T = TypeVar("T")

# /proc/stat's cpu line, in the kernel's order (guest and guest_nice are already inside user
# and nice, so neither the exporter nor node_exporter counts them as modes of their own)
PROC_STAT_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
EXPORTED_MODES = PROC_STAT_MODES[:8]
NOT_BUSY = ("idle", "iowait", "steal")  # node-mixin's meaning of CPU utilization
TICK = os.sysconf("SC_CLK_TCK")  # /proc/stat counts in USER_HZ ticks


def proc_stat() -> dict[str, int]:
    """Ticks per mode of the aggregate cpu line."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == "cpu":
            return dict(zip(PROC_STAT_MODES, map(int, fields[1:])))
    raise AssertionError("no cpu line in /proc/stat")


def online_cpus() -> int:
    return sum(1 for line in Path("/proc/stat").read_text().splitlines() if line.startswith("cpu") and line[3].isdigit())


def meminfo() -> dict[str, int]:
    """Bytes per /proc/meminfo field (the file says kB; the kernel means KiB)."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, rest = line.split(":", 1)
        value = rest.split()
        out[name] = int(value[0]) * (1024 if value[1:] == ["kB"] else 1)
    return out


def bracketed(oracle: Callable[[], T], value: Callable[[], object], tries: int = 50) -> tuple[T, object]:
    """(oracle reading, exporter value) from a try where the oracle read the same before and after."""
    for _ in range(tries):
        before = oracle()
        got = value()
        if oracle() == before:
            return before, got
    raise AssertionError(f"the oracle never read the same value twice in {tries} tries")


def busy_and_total(ticks: dict[str, int]) -> tuple[int, int]:
    total = sum(ticks[m] for m in EXPORTED_MODES)
    return total - sum(ticks[m] for m in NOT_BUSY), total


def test_cpu_seconds_per_mode_are_proc_stat_ticks():
    reader = HostReader()
    before = proc_stat()
    seconds = dict(reader.read().cpu_seconds)
    after = proc_stat()
    assert set(seconds) == set(EXPORTED_MODES)
    for mode in EXPORTED_MODES:
        low, high = before[mode] / TICK, after[mode] / TICK
        if mode == "iowait":  # the kernel's iowait may step backwards (NO_HZ accounting): either order
            low, high = min(low, high), max(low, high)
        assert low - 1e-9 <= seconds[mode] <= high + 1e-9, (mode, before[mode], seconds[mode] * TICK, after[mode])


def test_cpu_utilization_is_the_busy_share_between_two_refreshes():
    p0 = proc_stat()
    reader = HostReader()  # its first read: the start of the window
    p1 = proc_stat()
    # keep one core busy in this thread until the machine has ticked >= 1 s per core of CPU
    # time, so the window dwarfs the ticks that can fall inside a bracket (bounded: 20 s)
    deadline = time.monotonic() + 20
    while busy_and_total(proc_stat())[1] - busy_and_total(p1)[1] < TICK * online_cpus():
        assert time.monotonic() < deadline, "the CPU counters did not advance"
        sum(range(10_000))
    q0 = proc_stat()
    ratio = reader.read().cpu_utilization_ratio  # the end of the window
    q1 = proc_stat()
    (b_p0, t_p0), (b_p1, t_p1), (b_q0, t_q0), (b_q1, t_q1) = map(busy_and_total, (p0, p1, q0, q1))
    # the reader's window starts in [p0, p1] and ends in [q0, q1]
    low = (b_q0 - b_p1) / (t_q1 - t_p0)
    high = (b_q1 - b_p0) / (t_q0 - t_p1)
    assert low - 1e-9 <= ratio <= high + 1e-9, (low, ratio, high)
    # the spinning thread kept one core of the window busy: not the since-boot average of an idle box
    assert ratio >= 0.9 / online_cpus() - 0.05


def test_memory_total_and_available_are_meminfo():
    reader = HostReader()
    mem, sample = bracketed(lambda: (meminfo()["MemTotal"], meminfo()["MemAvailable"]), reader.read)
    assert sample.memory_total_bytes == mem[0]
    assert sample.memory_available_bytes == mem[1]


def test_swap_is_meminfo():
    reader = HostReader()
    swap, sample = bracketed(lambda: (meminfo()["SwapTotal"], meminfo()["SwapFree"]), reader.read)
    assert sample.swap_total_bytes == swap[0]
    assert sample.swap_used_bytes == swap[0] - swap[1]


def kernel_prints(load: float) -> str:
    """How fs/proc/loadavg.c prints a load held in 11-bit fixed point: adds FIXED_1/200 (integer 10),
    then truncates to two decimals, so the printed value is up to 0.0051 below the load."""
    fixed = load * 2048
    assert fixed == int(fixed), f"{load} is not an 11-bit fixed-point load"
    a = int(fixed) + 2048 // 200
    return f"{a >> 11}.{((a & 2047) * 100) >> 11:02d}"


def test_load_averages_are_proc_loadavg():
    reader = HostReader()
    printed, sample = bracketed(lambda: tuple(Path("/proc/loadavg").read_text().split()[:3]), reader.read)
    for got, shown in zip((sample.load1, sample.load5, sample.load15), printed):
        # libc reads either /proc/loadavg (two decimals) or sysinfo(2) (the kernel's fixed point)
        assert got == float(shown) or kernel_prints(got) == shown, (got, shown)


def test_logical_cores_are_the_online_cpus():
    assert HostReader().read().logical_cores == online_cpus()


def test_cpu_seconds_never_decrease_where_the_kernels_do(tmp_path, monkeypatch):
    """A real /proc/stat's layout in a tree psutil reads (psutil.PROCFS_PATH): iowait going
    back (proc(5) allows it) and the aggregate losing an offlined CPU's time are served as no
    growth, never as a decrease (a counter reset to Prometheus) nor as a jump."""
    import psutil

    for name in ("meminfo", "vmstat", "zoneinfo"):
        (tmp_path / name).write_text(Path(f"/proc/{name}").read_text())

    def kernel(**ticks: int) -> None:
        values = {**dict.fromkeys(PROC_STAT_MODES, 0), **ticks}
        (tmp_path / "stat").write_text("cpu  " + " ".join(str(values[m]) for m in PROC_STAT_MODES) + "\n")

    def served() -> dict[str, float]:
        return dict(reader.read().cpu_seconds)

    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    kernel(user=100 * TICK, idle=900 * TICK, iowait=50 * TICK)
    reader = HostReader()
    kernel(user=110 * TICK, idle=990 * TICK, iowait=45 * TICK)  # iowait back by 5 s
    first = served()
    assert (first["user"], first["idle"], first["iowait"]) == (110, 990, 50)
    assert reader.read().cpu_utilization_ratio == 0.1  # 10 s busy of 100 s, not skewed by the drop
    kernel(user=112 * TICK, idle=998 * TICK, iowait=47 * TICK)  # growing again: +2 s counts
    second = served()
    assert (second["user"], second["idle"], second["iowait"]) == (112, 998, 52)
    kernel(user=60 * TICK, idle=500 * TICK, iowait=20 * TICK)  # half the CPUs went offline
    third = served()
    assert third == second
    kernel(user=61 * TICK, idle=509 * TICK, iowait=20 * TICK)  # the rest keep counting from there
    fourth = served()
    assert (fourth["user"], fourth["idle"]) == (113, 1007)
    assert reader.read().cpu_utilization_ratio == 0.1
