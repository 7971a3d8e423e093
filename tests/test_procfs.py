"""ProcReader against real processes: children of this test in the real /proc, fake procfs trees
whose files link to those children's, and (as root) a private cgroup2 mount with a kubepods
tree that a real child is moved into."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from resmon_exporter.attribution.cgroups import ContainerRef, parse_cgroup
from resmon_exporter.attribution import procfs
from resmon_exporter.attribution.procfs import ProcReader
from fakenvml import Scrape

REPO = Path(__file__).resolve().parents[1]
UID = "1234abcd-5678-90ef-a1b2-c3d4e5f60718"
CID = "0123456789abcdef" * 4
KUBEPODS = (
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    + UID.replace("-", "_")
    + f".slice/cri-containerd-{CID}.scope"
)
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setuid child, cgroup2 mount)")


def start(argv: list[str], user: int | None = None, group: int | None = None) -> subprocess.Popen[bytes]:
    """The child, once its comm is the program's name: Popen can return before the kernel
    sets it (vfork's parent resumes when the new mm is in place, the name comes later)."""
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, user=user, group=group)
    comm = Path(f"/proc/{child.pid}/comm")
    deadline = time.monotonic() + 10
    while comm.read_text().rstrip("\n") != Path(argv[0]).name[:15]:
        if time.monotonic() > deadline:
            stop(child)
            raise AssertionError(f"{argv[0]} did not start")
        time.sleep(0.001)
    return child


def stop(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait(timeout=10)


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose comm is "gputrainer": a copy of sleep under that name."""
    program = tmp_path / "gputrainer"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", program)
    child = start([str(program), "600"])
    yield child
    stop(child)


def fake_proc(root: Path, pid: int, real_pid: int, cgroup: str) -> Path:
    """<root>/<pid>/: comm and status link to a real process's, cgroup is written."""
    base = root / str(pid)
    base.mkdir(parents=True)
    for name in ("comm", "status"):
        (base / name).symlink_to(f"/proc/{real_pid}/{name}")
    (base / "cgroup").write_text(cgroup)
    return base


def write_proc(root: Path, pid: int, comm: bytes, status: str, cgroup: str) -> Path:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "comm").write_bytes(comm)
    (base / "status").write_text(status)
    (base / "cgroup").write_text(cgroup)
    return base


def status_text(real: int, effective: int) -> str:
    uids = "\t".join(str(u) for u in (real, effective, effective, effective))
    return f"Name:\tgputrainer\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n"


def unknown_uid() -> int:
    uid = 424242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def pid_max() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())


# -- real children in the real /proc ---------------------------------------------------------


def test_real_child_comm_uid_and_user(trainer: subprocess.Popen[bytes]) -> None:
    info = ProcReader().read(trainer.pid)
    assert info is not None
    assert info.pid == trainer.pid
    assert info.comm == "gputrainer"
    assert info.uid == os.getuid()
    assert info.user == ("root" if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name)
    # the machine may itself be in a container: only check that the real cgroup file was used
    assert info.container == parse_cgroup(Path(f"/proc/{trainer.pid}/cgroup").read_text())


@as_root
def test_real_child_of_another_user() -> None:
    child = start(["/bin/sleep", "600"], user=NOBODY, group=NOBODY)
    try:
        info = ProcReader().read(child.pid)
    finally:
        stop(child)
    assert info is not None
    assert (info.comm, info.uid, info.user) == ("sleep", NOBODY, pwd.getpwuid(NOBODY).pw_name)
    assert info.user == "nobody"


def test_real_child_that_exited_is_none(trainer: subprocess.Popen[bytes]) -> None:
    stop(trainer)  # killed and reaped: /proc/<pid> is gone
    assert ProcReader().read(trainer.pid) is None


def test_pid_that_never_existed_is_none() -> None:
    reader = ProcReader()
    assert reader.read(pid_max() + 1) is None
    assert reader.read(0) is None
    assert reader.read(-1) is None


def test_own_process_is_read() -> None:
    # the positive control for the None cases above: the same reader finds a live pid
    info = ProcReader().read(os.getpid())
    assert info is not None
    assert info.comm == Path("/proc/self/comm").read_text().rstrip("\n")


# -- fake procfs trees -----------------------------------------------------------------------


def test_fake_tree_with_a_kubepods_cgroup(tmp_path: Path, trainer: subprocess.Popen[bytes]) -> None:
    fake_proc(tmp_path / "proc", 4242, trainer.pid, f"0::/{KUBEPODS}\n")
    info = ProcReader(str(tmp_path / "proc")).read(4242)
    assert info is not None
    assert (info.pid, info.comm, info.uid) == (4242, "gputrainer", os.getuid())
    assert info.container == ContainerRef(container_id=CID, pod_uid=UID, qos="burstable")


def test_fake_tree_whose_process_exited_is_none(tmp_path: Path, trainer: subprocess.Popen[bytes]) -> None:
    fake_proc(tmp_path / "proc", 4242, trainer.pid, f"0::/{KUBEPODS}\n")
    reader = ProcReader(str(tmp_path / "proc"))
    assert reader.read(4242) is not None
    stop(trainer)  # the links now dangle, the written cgroup file stays
    assert reader.read(4242) is None


def test_fake_tree_whose_pid_dir_is_gone_is_none(tmp_path: Path, trainer: subprocess.Popen[bytes]) -> None:
    base = fake_proc(tmp_path / "proc", 4242, trainer.pid, f"0::/{KUBEPODS}\n")
    shutil.rmtree(base)
    assert ProcReader(str(tmp_path / "proc")).read(4242) is None


def test_missing_root_is_none(tmp_path: Path) -> None:
    assert ProcReader(str(tmp_path / "absent")).read(1) is None
    assert ProcReader("/proc\0").read(1) is None  # a NUL in the path: ValueError, not raised


def test_missing_comm_is_gone_even_with_the_other_files(tmp_path: Path) -> None:
    base = write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), f"0::/{KUBEPODS}\n")
    (base / "comm").unlink()
    assert ProcReader(str(tmp_path)).read(7) is None


def test_unreadable_cgroup_while_alive_gives_an_empty_container(tmp_path: Path) -> None:
    base = write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), "")
    (base / "cgroup").unlink()
    (base / "cgroup").mkdir()  # reading it fails (EISDIR) whoever we are, root included
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert (info.comm, info.uid, info.container) == ("gputrainer", 0, ContainerRef())


def test_a_file_longer_than_one_read_is_read_whole(tmp_path: Path) -> None:
    # files are read with os.read in 64 KiB chunks: a cgroup v1 file of many hierarchies
    # longer than that still gives the container named on its last line
    filler = "".join(f"{n}:name=hierarchy{n}:/\n" for n in range(1, 9000))
    assert len(filler) > 2 * 65536
    write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), filler + f"0::/{KUBEPODS}\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert info.container == ContainerRef(container_id=CID, pod_uid=UID, qos="burstable")


def test_a_file_that_never_ends_is_read_only_so_far(tmp_path: Path) -> None:
    # a --path.procfs tree whose cgroup is a link to /dev/zero: the read stops (at 1 MiB)
    base = write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), "")
    (base / "cgroup").unlink()
    (base / "cgroup").symlink_to("/dev/zero")
    text = procfs._read(str(base / "cgroup"))
    assert text is not None and 1 << 20 <= len(text) < (1 << 20) + 65536
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None and info.container == ContainerRef()


def test_missing_cgroup_while_alive_gives_an_empty_container(tmp_path: Path, trainer: subprocess.Popen[bytes]) -> None:
    base = fake_proc(tmp_path, 4242, trainer.pid, "")
    (base / "cgroup").unlink()
    (base / "cgroup").symlink_to(tmp_path / "nowhere")
    info = ProcReader(str(tmp_path)).read(4242)
    assert info is not None
    assert (info.comm, info.container) == ("gputrainer", ContainerRef())


def test_unreadable_status_while_alive_gives_no_uid(tmp_path: Path) -> None:
    base = write_proc(tmp_path, 7, b"gputrainer\n", "", f"0::/{KUBEPODS}\n")
    (base / "status").unlink()
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert (info.uid, info.user) == (None, "")
    assert info.container.pod_uid == UID


def test_real_uid_not_effective(tmp_path: Path) -> None:
    # a setuid program: status says real 65534, effective 0; the job belongs to the real one
    write_proc(tmp_path, 7, b"gputrainer\n", status_text(NOBODY, 0), "0::/\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert (info.uid, info.user) == (NOBODY, pwd.getpwuid(NOBODY).pw_name)


def test_unknown_uid_is_its_number(tmp_path: Path) -> None:
    uid = unknown_uid()
    write_proc(tmp_path, 7, b"gputrainer\n", status_text(uid, uid), "0::/\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert (info.uid, info.user) == (uid, str(uid))


@pytest.mark.parametrize("line", ["Uid:\n", "Uid:\tx\t0\t0\t0\n", "Uid:\t\u0663\t0\t0\t0\n", "Gid:\t0\t0\t0\t0\n"])
def test_malformed_uid_line_gives_no_uid(tmp_path: Path, line: str) -> None:
    write_proc(tmp_path, 7, b"gputrainer\n", "Name:\tgputrainer\n" + line, "0::/\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert (info.comm, info.uid, info.user) == ("gputrainer", None, "")


def test_comm_that_is_not_utf8_decodes_with_replacement(tmp_path: Path) -> None:
    write_proc(tmp_path, 7, b"gpu\xfftrain\n", status_text(0, 0), "0::/\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert info.comm == "gpu\ufffdtrain"


def test_comm_keeps_its_spaces(tmp_path: Path) -> None:
    write_proc(tmp_path, 7, b" pt main thread \n", status_text(0, 0), "0::/\n")
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None
    assert info.comm == " pt main thread "


def stat_line(pid: int, comm: str, start: int) -> str:
    """/proc/PID/stat as the kernel writes it: starttime is field 22."""
    after = ["S", "1", *["0"] * 17, str(start), *["0"] * 30]
    return f"{pid} ({comm}) " + " ".join(after) + "\n"


def test_a_known_process_is_read_from_its_stat_alone(tmp_path: Path) -> None:
    # owner and container once per process (PID and start time); its comm on every read
    other = "0123456789abcdef" * 4
    base = write_proc(tmp_path, 7, b"ignored\n", status_text(0, 0), f"0::/{KUBEPODS}\n")
    (base / "stat").write_text(stat_line(7, "pt main) x", 1000))
    reader = ProcReader(str(tmp_path))
    first = reader.read(7)
    assert first is not None
    assert (first.comm, first.uid, first.container.container_id) == ("pt main) x", 0, CID)
    (base / "status").write_text(status_text(NOBODY, NOBODY))
    (base / "cgroup").write_text(f"0::/{KUBEPODS.replace(CID, other)}\n")
    (base / "stat").write_text(stat_line(7, "renamed", 1000))
    again = reader.read(7)
    assert again is not None
    assert (again.comm, again.uid, again.container.container_id) == ("renamed", 0, CID)
    # the PID reused by another process (another start time): read afresh
    (base / "stat").write_text(stat_line(7, "newjob", 2000))
    reused = reader.read(7)
    assert reused is not None
    assert (reused.comm, reused.uid, reused.container.container_id) == ("newjob", NOBODY, other)


def test_a_known_process_is_read_afresh_after_known_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = write_proc(tmp_path, 7, b"ignored\n", status_text(0, 0), "0::/\n")
    (base / "stat").write_text(stat_line(7, "job", 1000))
    reader = ProcReader(str(tmp_path))
    assert reader.read(7) is not None
    (base / "status").write_text(status_text(NOBODY, NOBODY))
    monkeypatch.setattr(procfs, "KNOWN_SECONDS", 0.0)
    info = reader.read(7)
    assert info is not None and info.uid == NOBODY


@pytest.mark.parametrize("stat", ["", "7 job S 1\n", "7 (job) S 1 0\n"])
def test_a_garbled_stat_falls_back_to_comm(tmp_path: Path, stat: str) -> None:
    base = write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), "0::/\n")
    (base / "stat").write_text(stat)
    info = ProcReader(str(tmp_path)).read(7)
    assert info is not None and (info.comm, info.uid) == ("gputrainer", 0)


def test_a_comm_ending_in_a_newline_reads_the_same_every_time(tmp_path: Path) -> None:
    # prctl(PR_SET_NAME) may set one; the comm file's own newline is stripped all the same
    base = write_proc(tmp_path, 7, b"ignored\n", status_text(0, 0), "0::/\n")
    (base / "stat").write_text(stat_line(7, "job\n", 1000))
    reader = ProcReader(str(tmp_path))
    names = [info.comm for info in (reader.read(7), reader.read(7)) if info is not None]
    assert names == ["job", "job"]


def test_a_process_read_in_part_is_read_again_next_time(tmp_path: Path) -> None:
    base = write_proc(tmp_path, 7, b"ignored\n", "", "0::/\n")
    (base / "status").unlink()  # unreadable this once (the process is alive: stat reads)
    (base / "stat").write_text(stat_line(7, "job", 1000))
    reader = ProcReader(str(tmp_path))
    first = reader.read(7)
    assert first is not None and first.uid is None
    (base / "status").write_text(status_text(NOBODY, NOBODY))
    again = reader.read(7)
    assert again is not None and again.uid == NOBODY


def test_a_process_whose_stat_is_gone_is_gone(tmp_path: Path) -> None:
    base = write_proc(tmp_path, 7, b"gputrainer\n", status_text(0, 0), "0::/\n")
    (base / "stat").write_text(stat_line(7, "job", 1000))
    reader = ProcReader(str(tmp_path))
    assert reader.read(7) is not None
    shutil.rmtree(base)
    assert reader.read(7) is None  # not served from what was known


def test_user_names_are_cached_per_uid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[int] = []
    real_getpwuid = pwd.getpwuid

    def counting(uid: int) -> pwd.struct_passwd:
        looked_up.append(uid)
        return real_getpwuid(uid)

    monkeypatch.setattr(pwd, "getpwuid", counting)
    for pid, uid in ((7, 0), (8, 0), (9, NOBODY), (10, 0), (11, NOBODY)):
        write_proc(tmp_path, pid, b"gputrainer\n", status_text(uid, uid), "0::/\n")
    reader = ProcReader(str(tmp_path))
    users = [info.user for pid in (7, 8, 9, 10, 11) if (info := reader.read(pid)) is not None]
    assert users == ["root", "root", "nobody", "root", "nobody"]
    assert looked_up == [0, NOBODY]


# -- the real kernel: a private cgroup2 mount with a kubepods tree ----------------------------


class Cgroup2:
    """A private cgroup2 mount with a uniquely named subtree, so nothing the host's kubelet
    or systemd owns is touched; removes the subtree and unmounts on close."""

    def __init__(self) -> None:
        self.mountpoint = Path(tempfile.mkdtemp(prefix="resmon-cgroup2-"))
        mounted = subprocess.run(
            ["mount", "-t", "cgroup2", "none", str(self.mountpoint)], check=False, capture_output=True, text=True
        )
        if mounted.returncode != 0:
            self.mountpoint.rmdir()
            pytest.skip(f"cannot mount cgroup2: {mounted.stderr.strip()}")
        self.top = self.mountpoint / f"resmon-test-{uuid.uuid4().hex[:12]}"
        self.top.mkdir()

    def cgroup(self, relative: str) -> Path:
        path = self.top / relative
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        for dirpath, _, _ in sorted(os.walk(self.top), key=lambda w: -len(Path(w[0]).parts)):
            remove_cgroup(Path(dirpath))
        subprocess.run(["umount", str(self.mountpoint)], check=True)
        self.mountpoint.rmdir()


def remove_cgroup(path: Path) -> None:
    # removable once no process is left in it; allow the kernel a moment after the last exit
    deadline = time.monotonic() + 5
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
def cgroup2() -> Iterator[Cgroup2]:
    mount = Cgroup2()
    try:
        yield mount
    finally:
        mount.close()


def move(pid: int, cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def in_kubepods(cgroup2: Cgroup2, trainer: subprocess.Popen[bytes]) -> None:
    move(trainer.pid, cgroup2.cgroup(KUBEPODS))
    # stopping the child (the fixture's teardown) empties the cgroup again before close()
    unified = [l for l in Path(f"/proc/{trainer.pid}/cgroup").read_text().splitlines() if l.startswith("0::")]
    assert unified == [f"0::/{cgroup2.top.name}/{KUBEPODS}"]


@as_root
def test_real_kernel_kubepods_cgroup(cgroup2: Cgroup2, trainer: subprocess.Popen[bytes]) -> None:
    in_kubepods(cgroup2, trainer)
    # the tree is below the test's own cgroup: a kubelet would be run with that --cgroup-root
    info = ProcReader(cgroup_root="/" + cgroup2.top.name).read(trainer.pid)
    spoof = ProcReader().read(trainer.pid)  # without it, kubepods below another cgroup is no pod
    stop(trainer)
    assert info is not None and spoof is not None
    assert info.comm == "gputrainer"
    assert info.container == ContainerRef(container_id=CID, pod_uid=UID, qos="burstable")
    assert spoof.container == ContainerRef()


def read_from_namespace(namespace_root: Path, pid: int) -> dict[str, object]:
    """ProcReader run by a process in a new cgroup namespace rooted at namespace_root."""
    code = (
        "import dataclasses, json, sys\n"
        "from resmon_exporter.attribution.procfs import ProcReader\n"
        "pid = int(sys.argv[1])\n"
        "info = ProcReader().read(pid)\n"
        "print(json.dumps({'cgroup': open(f'/proc/{pid}/cgroup').read(),"
        " 'comm': info.comm, 'container': dataclasses.asdict(info.container)}))\n"
    )
    unshare = shutil.which("unshare") or "unshare"
    result = subprocess.run(
        [unshare, "--cgroup", sys.executable, "-c", code, str(pid)],
        check=False,
        preexec_fn=lambda: move(os.getpid(), namespace_root),  # unshare takes its own cgroup as the root
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@as_root
@pytest.mark.parametrize(
    "reader_cgroup, seen_path",
    [("", f"/{KUBEPODS}"), ("other/a/b", f"/../../../{KUBEPODS}")],
    ids=["namespace-at-the-top", "namespace-three-levels-down"],
)
def test_real_kernel_from_a_private_cgroup_namespace(
    cgroup2: Cgroup2, trainer: subprocess.Popen[bytes], reader_cgroup: str, seen_path: str
) -> None:
    in_kubepods(cgroup2, trainer)
    seen = read_from_namespace(cgroup2.cgroup(reader_cgroup) if reader_cgroup else cgroup2.top, trainer.pid)
    stop(trainer)
    assert f"0::{seen_path}\n" in str(seen["cgroup"])  # the kernel really showed this form
    assert seen["comm"] == "gputrainer"
    assert seen["container"] == {"container_id": CID, "pod_uid": UID, "qos": "burstable", "job_id": ""}


SLURM_STEP = "system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0"


@as_root
@pytest.mark.parametrize(
    "reader_cgroup, seen_path",
    [("", f"/{SLURM_STEP}"),
     ("system.slice/slurmd.service", "/../" + SLURM_STEP.removeprefix("system.slice/")),
     ("other.slice/exporter.service", f"/../../{SLURM_STEP}")],
    ids=["namespace-at-the-top", "namespace-in-slurmds-slice", "namespace-in-another-slice"],
)
def test_real_kernel_slurm_job_from_a_cgroup_namespace(
    cgroup2: Cgroup2, trainer: subprocess.Popen[bytes], reader_cgroup: str, seen_path: str
) -> None:
    # the tree slurmstepd's cgroup/v2 plugin makes, on a real cgroup2 mount; the reader in its
    # own namespace, as a containerised exporter with a private cgroup namespace sees it
    move(trainer.pid, cgroup2.cgroup(SLURM_STEP))
    seen = read_from_namespace(cgroup2.cgroup(reader_cgroup) if reader_cgroup else cgroup2.top, trainer.pid)
    stop(trainer)
    assert f"0::{seen_path}\n" in str(seen["cgroup"])  # the kernel really showed this form
    assert seen["container"] == {"container_id": "", "pod_uid": "", "qos": "", "job_id": "4242"}


def test_a_user_name_that_is_not_utf8_is_the_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Latin-1 passwd entry comes back with surrogates, which no scrape could encode."""
    real = pwd.getpwuid

    def latin1(uid: int) -> pwd.struct_passwd:
        entry = real(uid)
        return pwd.struct_passwd(("j\udcfcrgen", *tuple(entry)[1:]))

    monkeypatch.setattr(pwd, "getpwuid", latin1)
    info = ProcReader().read(os.getpid())
    assert info is not None and info.user == str(os.getuid())
    info.user.encode("utf-8")


def test_the_cgroup_parse_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import resmon_exporter.attribution.procfs as procfs

    monkeypatch.setattr(procfs, "_CGROUP_CACHE", 2)
    me = os.getpid()
    (tmp_path / str(me)).mkdir()
    for name in ("comm", "status"):
        (tmp_path / str(me) / name).symlink_to(f"/proc/{me}/{name}")
    reader = ProcReader(str(tmp_path))
    for i in range(5):
        cid = f"{i:x}" * 64
        (tmp_path / str(me) / "cgroup").write_text(f"0::/system.slice/docker-{cid[:64]}.scope\n")
        info = reader.read(me)
        assert info is not None and info.container.container_id == cid[:64]  # never a stale parse
        assert len(reader._cgroups) <= 2


# -- a procfs that blocks costs the processes, never the GPU collector (issue 22, 16) ----------


def test_a_procfs_read_that_blocks_costs_the_processes_never_the_gpu(run_exporter, scenario, workloads, tmp_path):
    """A process whose stat blocks (here a FIFO without a writer; a hung FUSE or network
    mount as --path.procfs does the same): the scrape answers within its deadline with the GPU
    collector successful, the processes collector failed, and the processes read in time."""
    from fakenvml import GIB
    from scenarios import board_uuid
    from workloads import HOST, procfs_tree

    fine, stuck = workloads.start("trainer"), workloads.start("infer")
    proc = procfs_tree(tmp_path / "proc", {fine: HOST, stuck: HOST})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.link(fifo, proc / str(stuck) / "stat")  # the same FIFO under a second name, to unblock it below
    scenario.write({"count": 1, "gpu.0.uuid": board_uuid("hopper", 0), "gpu.0.processes": f"{fine}:{GIB},{stuck}:{GIB}"})
    exporter = run_exporter("--collector.processes", f"--path.procfs={proc}", "--collect.timeout=3s", "--collect.cache-ttl=0")
    try:
        for _ in range(3):  # the stuck round is not waited for again, nor are threads piled up
            status, _, body = exporter.request("/metrics", timeout=15)
            assert status == 200
            s = Scrape(body.decode())
            assert s.value("resmon_collector_success", collector="gpu") == 1
            assert s.value("resmon_gpu_up", gpu="0") == 1
            assert s.value("resmon_collector_success", collector="processes") == 0
            assert not s.has("resmon_gpu_process_memory_used_bytes", pid=str(stuck))
            assert s.value("resmon_gpu_process_memory_used_bytes", pid=str(fine)) == GIB  # read before it
        # the mount recovers: the stuck read returns, the next rounds read a plain file
        (tmp_path / "stat").write_text(f"{stuck} (infer) S " + " ".join(["1"] * 49) + "\n")
        os.replace(tmp_path / "stat", proc / str(stuck) / "stat")
    finally:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # EOF for the blocked reader
        except OSError:
            pass  # ENXIO: nobody was blocked in it
    s = exporter.wait_for(lambda s: s.value("resmon_collector_success", collector="processes") == 1)
    assert s.value("resmon_gpu_process_memory_used_bytes", pid=str(stuck)) == GIB
    assert s.value("resmon_gpu_process_memory_used_bytes", pid=str(fine)) == GIB
