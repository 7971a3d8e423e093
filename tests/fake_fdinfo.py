"""A fake procfs tree with DRM fds, for the DRM client usage stats reader (--path.procfs=<root>).

Like the kernel's: <pid>/fd/<N> are symlinks whose targets are what the kernel shows
(/dev/dri/renderD128, socket:[123], /dev/null: none of them need exist), <pid>/fdinfo/<N>
starts with the generic pos/flags/mnt_id/ino lines and goes on with the driver's drm- keys;
<pid>/comm, status (with its Uid: line) and cgroup are there for readers that attribute
processes. Writes are atomic (a temp file, then rename), as a reader may scan concurrently.

The helpers amdgpu_client(), i915_client() and xe_client() return fdinfo texts in the shape
each driver prints (sizes as drm_print_memory_stats does: the largest of B, KiB, MiB that
divides the value; legacy amdgpu drm-memory- keys in KiB).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# the lines every fdinfo starts with, whatever the file
GENERIC = "pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1234\n"


def kernel_size(n: int) -> str:
    """A size as the kernel's drm_fdinfo_print_size writes it."""
    unit = ""
    for bigger in (" KiB", " MiB"):
        if n == 0 or n % 1024:
            break
        n //= 1024
        unit = bigger
    return f"{n}{unit}"


def _memory(region: str, total: int, resident: int | None = None) -> str:
    resident = total if resident is None else resident
    return (
        f"drm-total-{region}:\t{kernel_size(total)}\n"
        f"drm-shared-{region}:\t0\n"
        f"drm-active-{region}:\t0\n"
        f"drm-resident-{region}:\t{kernel_size(resident)}\n"
        f"drm-purgeable-{region}:\t0\n"
    )


def amdgpu_client(
    pdev: str,
    client_id: int,
    gfx_ns: int | None = 0,
    compute_ns: int | None = None,
    vram_kib: int | None = 0,
    gtt_kib: int = 2048,
    legacy: bool = False,
) -> str:
    """amdgpu (6.x: drm_print_memory_stats per TTM placement; legacy=True: 5.19-6.8, only
    drm-memory-<region> in KiB). It prints only the engines it used: None leaves one out;
    vram_kib None leaves out the VRAM region (an APU that has no VRAM placement)."""
    text = f"drm-driver:\tamdgpu\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{pdev}\npasid:\t32770\n"
    if legacy:
        if vram_kib is not None:
            text += f"drm-memory-vram:\t{vram_kib} KiB\n"
        # the kernel's own spacing: a blank before the tab
        text += f"drm-memory-gtt: \t{gtt_kib} KiB\ndrm-memory-cpu: \t0 KiB\n"
    else:
        text += _memory("cpu", 0) + _memory("gtt", gtt_kib * KIB)
        if vram_kib is not None:
            text += _memory("vram", vram_kib * KIB)
            text += f"amd-evicted-vram:\t0 KiB\namd-requested-vram:\t{vram_kib} KiB\n"
        text += f"amd-requested-gtt:\t{gtt_kib} KiB\n"
    if gfx_ns is not None:
        text += f"drm-engine-gfx:\t{gfx_ns} ns\n"
    if compute_ns is not None:
        text += f"drm-engine-compute:\t{compute_ns} ns\n"
    return text


def i915_client(
    pdev: str,
    client_id: int,
    render_ns: int = 0,
    copy_ns: int = 0,
    video_ns: int = 0,
    compute_ns: int = 0,
    local0_bytes: int | None = None,
) -> str:
    """i915: system0 always, local0 (and its stolen part) on a discrete card only; two video
    engines (drm-engine-capacity-video: 2)."""
    text = f"drm-driver:\ti915\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{pdev}\n"
    text += _memory("system0", 8 * MIB, 6 * MIB) + _memory("stolen-system0", 0)
    if local0_bytes is not None:
        text += _memory("local0", local0_bytes) + _memory("stolen-local0", 4 * MIB)
    text += (
        f"drm-engine-render:\t{render_ns} ns\n"
        f"drm-engine-copy:\t{copy_ns} ns\n"
        f"drm-engine-video:\t{video_ns} ns\n"
        "drm-engine-capacity-video:\t2\n"
        "drm-engine-video-enhance:\t0 ns\n"
        f"drm-engine-compute:\t{compute_ns} ns\n"
    )
    return text


def xe_client(
    pdev: str,
    client_id: int,
    rcs_cycles: int = 0,
    rcs_total: int = 0,
    ccs_cycles: int = 0,
    ccs_total: int = 0,
    vram0_bytes: int | None = None,
    ccs_capacity: int = 1,
) -> str:
    """xe: run ticks per engine class over the GPU timestamp (drm-cycles- / drm-total-cycles-),
    memory in system, stolen and (discrete) vram0; capacity printed where more than one."""
    text = f"drm-driver:\txe\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{pdev}\n"
    text += _memory("system", 16 * MIB) + _memory("stolen", 0)
    if vram0_bytes is not None:
        text += _memory("vram0", vram0_bytes)
    engines = (("rcs", rcs_cycles, rcs_total, 1), ("bcs", 0, rcs_total, 1), ("vcs", 0, rcs_total, 2),
               ("vecs", 0, rcs_total, 1), ("ccs", ccs_cycles, ccs_total, ccs_capacity))
    for name, busy, total, capacity in engines:
        text += f"drm-cycles-{name}:\t{busy}\ndrm-total-cycles-{name}:\t{total}\n"
        if capacity > 1:
            text += f"drm-engine-capacity-{name}:\t{capacity}\n"
    return text


def _render(fdinfo: dict[str, str] | str) -> str:
    if isinstance(fdinfo, dict):
        return "".join(f"{k}:\t{v}\n" for k, v in fdinfo.items())
    return fdinfo


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class Clock:
    """A monotonic clock the test moves (the readers' clock= argument)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


HOST_PID_NS = "pid:[4026531836]"  # PROC_PID_INIT_INO: the initial pid namespace's inode
CONTAINER_PID_NS = "pid:[4026532481]"


class FakeProc:
    """A procfs tree under root: processes, their fds and fdinfo."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # what a real procfs lists besides processes
        (self.root / "sys").mkdir(exist_ok=True)
        (self.root / "meminfo").write_text("MemTotal:       16384000 kB\n")
        if not (self.root / "self").is_symlink():
            os.symlink("1", self.root / "self")
        if not self.pid_dir(1).exists():  # the host's init: its pid namespace says this is the host's /proc
            self.add_process(1, comm="systemd", uid=0)

    def pid_dir(self, pid: int) -> Path:
        return self.root / str(pid)

    def add_process(self, pid: int, comm: str = "python3", uid: int = 1000) -> Path:
        d = self.pid_dir(pid)
        (d / "fd").mkdir(parents=True, exist_ok=True)
        (d / "fdinfo").mkdir(exist_ok=True)
        _write(d / "comm", f"{comm}\n")
        _write(d / "status", f"Name:\t{comm}\nTgid:\t{pid}\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        _write(d / "cgroup", "0::/user.slice\n")
        self.set_pid_namespace(pid, HOST_PID_NS)
        return d

    def set_pid_namespace(self, pid: int, link: str) -> None:
        """/proc/PID/ns/pid: pid:[4026531836] is the host's (initial) namespace; another inode,
        e.g. pid 1 of a container's own /proc, is not."""
        ns = self.pid_dir(pid) / "ns"
        ns.mkdir(parents=True, exist_ok=True)
        tmp = ns / ".pid.tmp"
        os.symlink(link, tmp)
        os.replace(tmp, ns / "pid")

    def add_fd(self, pid: int, fd: int, target: str) -> None:
        """/proc/PID/fd/FD -> target (need not exist), no fdinfo."""
        d = self.pid_dir(pid)
        if not d.exists():
            self.add_process(pid)
        link = d / "fd" / str(fd)
        tmp = link.with_name(f".{fd}.tmp")
        os.symlink(target, tmp)
        os.replace(tmp, link)

    def add_drm_fd(self, pid: int, fd: int, fdinfo: dict[str, str] | str, node: str = "renderD128") -> None:
        """An open DRM file: fd -> /dev/dri/<node>, and its fdinfo."""
        self.add_fd(pid, fd, f"/dev/dri/{node}")
        self.set_fdinfo(pid, fd, fdinfo)

    def set_fdinfo(self, pid: int, fd: int, fdinfo: dict[str, str] | str) -> None:
        """Rewrite the fdinfo of an fd (its drm- lines after the generic ones), atomically."""
        d = self.pid_dir(pid) / "fdinfo"
        d.mkdir(parents=True, exist_ok=True)
        _write(d / str(fd), GENERIC + _render(fdinfo))

    def remove_fdinfo(self, pid: int, fd: int) -> None:
        (self.pid_dir(pid) / "fdinfo" / str(fd)).unlink()

    def remove_fd(self, pid: int, fd: int) -> None:
        for sub in ("fd", "fdinfo"):
            path = self.pid_dir(pid) / sub / str(fd)
            if path.is_symlink() or path.exists():
                path.unlink()

    def remove_process(self, pid: int) -> None:
        shutil.rmtree(self.pid_dir(pid))
