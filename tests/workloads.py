"""Real processes for the fake NVML to list, and the directory trees that say who owns them.

- Workloads: real child processes with a chosen comm (a copy of sleep under that name),
  optionally under another uid (root only), killed at the end.
- procfs_tree(): a --path.procfs directory whose PID entries link comm and status to the
  real /proc (the real comm and uid) and carry a written cgroup file (the runtime shape).
- pod_logs(): the kubelet's /var/log/pods/<namespace>_<pod>_<uid>/<container>/ layout;
  container_logs(): its /var/log/containers/<pod>_<namespace>_<container>-<id>.log links.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

UID = "3f7a2b1c-9d8e-4f60-a1b2-c3d4e5f60718"
UID2 = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"
CID = "a" * 64
CID2 = "b" * 64
CID3 = "c" * 64


def systemd_containerd(uid: str, cid: str, qos: str = "burstable") -> str:
    u = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{cid}.scope\n"
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/cri-containerd-{cid}.scope\n"


def crio(uid: str, cid: str) -> str:
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{cid}.scope\n"


def cgroupfs_docker(uid: str, cid: str) -> str:
    return "".join(f"{n}:{c}:/kubepods/pod{uid}/{cid}\n" for n, c in ((12, "memory"), (4, "devices"), (1, "name=systemd")))


HOST = "0::/user.slice/user-0.slice/session-1.scope\n"


class Workloads:
    def __init__(self, root: Path) -> None:
        self._root = root
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, comm: str, uid: int | None = None) -> int:
        """A sleeping child whose comm is `comm` (<= 15 characters); its PID."""
        exe = self._root / comm
        if not exe.exists():
            shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
            exe.chmod(0o755)
            os.chmod(self._root, 0o755)
        proc = subprocess.Popen([str(exe), "600"], user=uid, stdin=subprocess.DEVNULL)
        self._procs.append(proc)
        return proc.pid

    def exited_pid(self) -> int:
        """The PID of a child that has exited (and been reaped)."""
        proc = subprocess.Popen(["true"])
        proc.wait()
        return proc.pid

    def stop(self) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait(10)


def procfs_tree(root: Path, cgroups: dict[int, str]) -> Path:
    """A procfs directory for the exporter: each PID's comm and status are the real
    process's (links), its cgroup the given text; "self" exists as in a real mount."""
    (root / "self").mkdir(parents=True, exist_ok=True)
    for pid, text in cgroups.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        for name in ("comm", "status"):
            if not (d / name).is_symlink():
                (d / name).symlink_to(f"/proc/{pid}/{name}")
        (d / "cgroup").write_text(text)
    return root


def pod_logs(root: Path, pods: list[tuple[str, str, str, list[str]]]) -> Path:
    """(namespace, pod, uid, containers) -> the kubelet's pod log directories."""
    root.mkdir(parents=True, exist_ok=True)
    for namespace, pod, uid, containers in pods:
        for container in containers:
            (root / f"{namespace}_{pod}_{uid}" / container).mkdir(parents=True, exist_ok=True)
            (root / f"{namespace}_{pod}_{uid}" / container / "0.log").write_text("")
    return root


def container_logs(root: Path, pod_logs_root: Path, containers: list[tuple[str, str, str, str, str]]) -> Path:
    """(namespace, pod, uid, container, container id) -> the kubelet's container log links."""
    root.mkdir(parents=True, exist_ok=True)
    for namespace, pod, uid, container, cid in containers:
        target = pod_logs_root / f"{namespace}_{pod}_{uid}" / container / "0.log"
        (root / f"{pod}_{namespace}_{container}-{cid}.log").symlink_to(target)
    return root
