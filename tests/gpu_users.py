"""Real processes using a fake GPU, with the host files and the kubelet that attribute them
to pods (the processes and kubernetes collectors), for the stack and fleet tests."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from fake_kubelet import Container, Device, FakeKubelet, Pod, short_socket_dir
from fakenvml import GIB, gpu_keys

# Who uses the GPU (processes and kubernetes collectors): GPU 0 is time-sliced between two
# pods. team-a/train-0's process holds POD_VRAM, a host process HOST_VRAM; team-b/notebook-1
# holds a replica of GPU 0 and GPU 1 but runs nothing on them. No pod may be shown the
# device's whole VRAM. A third process runs in Slurm job JOB_ID (its cgroup slurmstepd's, v2)
# on GPU 1, holding JOB_VRAM: the Slurm jobs table's row.
POD_UID = "7d5f3c1e-2b4a-4c6d-8e9f-0a1b2c3d4e5f"
CONTAINER_ID = "4f6c" * 16
POD_VRAM, HOST_VRAM = 40 * GIB, 20 * GIB
POD_SM, HOST_SM = 50, 30  # percent, in every process utilization sample
JOB_ID, JOB_VRAM, JOB_SM = "4242", 10 * GIB, 40
JOB_CGROUP = f"0::/system.slice/slurmstepd.scope/job_{JOB_ID}/step_batch/user/task_0\n"


def wait_until(what: str, check: Any, timeout: float) -> None:
    """Bounded wait for a state. Here, not promstack's: the demo image (demo/Dockerfile) carries
    this file without promstack.py and its yaml, and the demo runs the pods from it."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class GpuUsers:
    """Two real children of the test as the GPU's processes, and the host files the exporter
    reads about them: --path.procfs is a tree holding their real comm and status, and the real
    cgroup for the host process but a kubepods one (containerd, systemd driver) for the pod's;
    --kubernetes.pod-logs-dir names that pod's UID; a fake kubelet lists the allocations."""

    def __init__(self, root: Path, uuids: tuple[str, str]) -> None:
        """uuids: of the node's GPUs 0 and 1, which the kubelet hands out."""
        self.uuids = uuids
        self.children: list[subprocess.Popen[bytes]] = []
        self.socket_dir: str | None = None
        self.kubelet: FakeKubelet | None = None
        try:
            self._start(root)
        except BaseException:
            self.stop()  # the children and the socket directory made so far
            raise

    def _start(self, root: Path) -> None:
        uuids = self.uuids
        for _ in range(3):  # one at a time: a failed second start still leaves the first to stop()
            self.children.append(subprocess.Popen(["sleep", "3600"]))
        self.host_pid, self.pod_pid, self.job_pid = (c.pid for c in self.children)
        # Popen can return (vfork) before exec renamed a child: its comm reads "python" until then
        for pid in (self.host_pid, self.pod_pid, self.job_pid):
            wait_until(f"pid {pid} exec'd", lambda: Path(f"/proc/{pid}/comm").read_text() == "sleep\n", 10)
        self.procfs, self.pod_logs = root / "proc", root / "pods"
        (self.procfs / "self").mkdir(parents=True)  # what the exporter checks a procfs by
        kubepods = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                    f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER_ID}.scope\n")
        for pid in (self.host_pid, self.pod_pid, self.job_pid):
            (self.procfs / str(pid)).mkdir()
            for name in ("comm", "status", "cgroup"):
                text = Path(f"/proc/{pid}/{name}").read_text()
                if name == "cgroup" and pid != self.host_pid:
                    text = kubepods if pid == self.pod_pid else JOB_CGROUP
                (self.procfs / str(pid) / name).write_text(text)
        (self.pod_logs / f"team-a_train-0_{POD_UID}" / "trainer").mkdir(parents=True)
        (self.pod_logs / f"team-a_train-0_{POD_UID}" / "trainer" / "0.log").write_text("")
        self.socket_dir = short_socket_dir()
        self.kubelet = FakeKubelet(str(Path(self.socket_dir) / "kubelet.sock"))  # stop() is safe before start()
        self.kubelet.start()
        self.kubelet.pods = [
            Pod("team-a", "train-0", [Container("trainer", [Device("nvidia.com/gpu", [f"{uuids[0]}::0"])])]),
            Pod("team-b", "notebook-1", [Container("lab", [Device("nvidia.com/gpu", [f"{uuids[0]}::1", uuids[1]])])]),
        ]

    def args(self) -> list[str]:
        assert self.kubelet is not None, "stopped"
        return ["--collector.processes", f"--path.procfs={self.procfs}", f"--kubernetes.pod-logs-dir={self.pod_logs}",
                f"--kubernetes.pod-resources-socket={self.kubelet.socket_path}", "--kubernetes.cache-ttl=500ms"]

    def scenario(self) -> dict[str, Any]:
        return {**gpu_keys(0, processes=f"{self.host_pid}:{HOST_VRAM},{self.pod_pid}:{POD_VRAM}",
                           process_util=f"{self.host_pid}:{HOST_SM}:10:0:0,{self.pod_pid}:{POD_SM}:20:0:0"),
                **gpu_keys(1, processes=f"{self.job_pid}:{JOB_VRAM}", process_util=f"{self.job_pid}:{JOB_SM}:10:0:0")}

    @property
    def user(self) -> str:
        """The children's (real uid from their status files): the test's own."""
        return pwd.getpwuid(os.getuid()).pw_name

    def stop(self) -> None:
        """Idempotent, and safe on a half-started instance (__init__ calls it on failure)."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait(5)
