"""The Slurm job of a process from its cgroup file: every path slurmstepd creates (cgroup v1
and v2, every kind of step, job arrays, multiple slurmd), the places it never puts a job
(spoofs from delegated subtrees, a slurmd inside a container), and how the job combines with
the container and pod of the same file."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resmon_exporter.attribution.cgroups import ContainerRef, parse_cgroup
from resmon_exporter.attribution.slurm import job_id

CID = "0123456789abcdef" * 4
UID = "1234abcd-5678-90ef-a1b2-c3d4e5f60718"
POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
V2 = "/system.slice/slurmstepd.scope"


def v1(path: str) -> str:
    """A cgroup v1 file as slurmd's cgroup/v1 plugin leaves it: the job in the controllers it
    constrains (cpuset, memory, devices, freezer), the rest in slurmd's own service."""
    constrained = [(11, "cpuset"), (9, "memory"), (6, "devices"), (4, "freezer")]
    other = [(12, "pids"), (10, "cpu,cpuacct"), (1, "name=systemd")]
    lines = [f"{n}:{c}:{path}" for n, c in constrained] + [f"{n}:{c}:/system.slice/slurmd.service" for n, c in other]
    return "\n".join(lines) + "\n"


JOBS: dict[str, tuple[str, str]] = {
    # cgroup v2 (cgroup/v2 plugin): /<slice>/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>
    "v2-batch": (f"0::{V2}/job_42/step_batch/user/task_0\n", "42"),
    "v2-extern": (f"0::{V2}/job_42/step_extern/user/task_0\n", "42"),  # pam_slurm_adopt's ssh sessions
    "v2-step-n": (f"0::{V2}/job_42/step_3/user/task_1\n", "42"),
    "v2-interactive": (f"0::{V2}/job_42/step_interactive/user/task_0\n", "42"),
    "v2-heterogeneous": (f"0::{V2}/job_42/step_0+1/user/task_0\n", "42"),
    "v2-task-special": (f"0::{V2}/job_42/step_0/user/task_special\n", "42"),
    "v2-slurmstepd-itself": (f"0::{V2}/job_42/step_0/slurm\n", "42"),
    "v2-container-below-the-step": (f"0::{V2}/job_42/step_0/user/task_0/libpod-{CID}.scope\n", "42"),
    "v2-other-slice": (f"0::/slurm.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n", "7"),  # CgroupSlice
    "v2-multiple-slurmd": (f"0::/system.slice/node07_slurmstepd.scope/job_42/step_0/user/task_0\n", "42"),
    # a job array's task: the cgroup carries the task's own job id (squeue's 1234_7 is 1235)
    "v2-array-task": (f"0::{V2}/job_1235/step_batch/user/task_0\n", "1235"),
    "v2-largest-id": (f"0::{V2}/job_4294967294/step_0/user/task_0\n", "4294967294"),
    # cgroup v1 (cgroup/v1 plugin): /slurm/uid_<uid>/job_<id>/step_<step>[/task_<n>]
    "v1-batch": (v1("/slurm/uid_1000/job_42/step_batch"), "42"),
    "v1-step-task": (v1("/slurm/uid_1000/job_42/step_0/task_3"), "42"),
    "v1-extern": (v1("/slurm/uid_1000/job_42/step_extern"), "42"),
    "v1-array-task": (v1("/slurm/uid_1000/job_1235/step_batch"), "1235"),
    "v1-multiple-slurmd": (v1("/slurm_node07/uid_1000/job_42/step_0"), "42"),
    # seen from a cgroup namespace: relative to the reader's cgroup (a child of the slice, or
    # the slice's sibling)
    "v2-relative-from-the-slice": (f"0::/../slurmstepd.scope/job_42/step_0/user/task_0\n", "42"),
    "v2-relative-from-a-sibling-slice": (f"0::/../../system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n", "42"),
    "v1-relative": (v1("/../slurm/uid_1000/job_42/step_0"), "42"),
}

NOT_JOBS: dict[str, str] = {
    "host-session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "slurmd-itself": "0::/system.slice/slurmd.service\n",
    "the-scope-alone": f"0::{V2}/system\n",  # slurmstepd's own processes, outside every job
    "the-job-without-a-step": f"0::{V2}/job_42\n",  # slurmstepd puts processes only in steps
    "not-a-step": f"0::{V2}/job_42/user/task_0\n",
    "an-unknown-step-name": f"0::{V2}/job_42/step_foo/user/task_0\n",
    "job-zero": f"0::{V2}/job_0/step_0/user/task_0\n",  # job_%u of a real job is never 0
    "leading-zero": f"0::{V2}/job_042/step_0/user/task_0\n",
    "an-array-name": f"0::{V2}/job_1234_7/step_0/user/task_0\n",
    "an-11-digit-id": f"0::{V2}/job_12345678901/step_0/user/task_0\n",
    # Slurm 26.05 names the cgroup after the job's SLUID unless CgroupJobIdPaths=yes
    "sluid": f"0::{V2}/sEKNKTV3WPV500/step_0/user/task_0\n",
    # a delegated subtree can name cgroups anything: systemd user delegation, rootless podman
    "user-delegation": "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_42/step_0\n",
    "below-a-service": f"0::/system.slice/myjob.service{V2}/job_42/step_0/user/task_0\n",
    # a slurmd in a container, seen from outside it: not this node's job
    "slurmd-in-docker": f"0::/system.slice/docker-{CID}.scope{V2}/job_42/step_0/user/task_0\n",
    "v1-without-uid": v1("/slurm/job_42/step_0"),
    "v1-below-something": v1("/user.slice/slurm/uid_1000/job_42/step_0"),
    "v1-uid-name": v1("/slurm/uid_bob/job_42/step_0"),
    "relative-scope-not-first": f"0::/../user/slurmstepd.scope/job_42/step_0\n",
    "empty": "",
    "garbage": "\x00\xff not a cgroup file",
}


@pytest.mark.parametrize("text, expected", JOBS.values(), ids=JOBS.keys())
def test_the_job_where_slurmstepd_puts_it(text: str, expected: str) -> None:
    ref = parse_cgroup(text)
    assert ref.job_id == expected and ref.pod_uid == ref.qos == ""


@pytest.mark.parametrize("text", NOT_JOBS.values(), ids=NOT_JOBS.keys())
def test_no_job_anywhere_else(text: str) -> None:
    assert parse_cgroup(text).job_id == ""


def test_inside_another_job_the_outer_job_wins() -> None:
    # a job's own processes can create cgroups below its step (a container): they stay that job's
    assert parse_cgroup(f"0::{V2}/job_7/step_0/user/task_0{V2}/job_42/step_0\n").job_id == "7"


def test_a_container_in_a_job_keeps_both() -> None:
    # podman (or enroot, apptainer with cgroups) inside a job step: the container and the job
    ref = parse_cgroup(JOBS["v2-container-below-the-step"][0])
    assert ref == ContainerRef(container_id=CID, job_id="42")


def test_a_pod_is_never_in_a_job() -> None:
    # a v1 file whose controllers disagree (only root can write such a hierarchy): the pod,
    # which the kubelet confirms, and no job
    text = f"9:memory:{POD}/cri-containerd-{CID}.scope\n6:devices:/slurm/uid_1000/job_42/step_0\n"
    assert parse_cgroup(text) == ContainerRef(container_id=CID, pod_uid=UID, qos="burstable")


def test_the_first_line_that_names_a_job_gives_it() -> None:
    text = "11:cpuset:/slurm/uid_1000/job_42/step_0\n9:memory:/slurm/uid_1000/job_43/step_0\n"
    assert parse_cgroup(text).job_id == "42"


def test_job_id_of_one_path() -> None:
    assert job_id(f"{V2}/job_42/step_batch/user/task_0") == "42"
    assert job_id("/slurm/uid_0/job_9/step_extern") == "9"
    assert job_id("/") == job_id("") == job_id("/../..") == ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["..", "system.slice", "slurmstepd.scope", "slurm", "uid_1", "job_42", "job_0",
                                 "step_0", "step_batch", "user", "task_0", "x.slice", ""]), max_size=8))
def test_never_raises_and_a_job_only_with_its_step(elements: list[str]) -> None:
    found = job_id("/" + "/".join(elements))
    assert found in ("", "42")
    elements = [e for e in elements if e]
    if found:  # a job is always followed by one of its steps
        at = elements.index("job_42")
        assert elements[at + 1].startswith("step_")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_parse_cgroup_never_raises_on_garbage(text: str) -> None:
    ref = parse_cgroup(text)
    assert ref.job_id == "" or ref.job_id.isdigit()
