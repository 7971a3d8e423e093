"""The Slurm job a process runs in, from one path of /proc/PID/cgroup.

slurmstepd puts every process of a job step into a cgroup named after the job and the step:

- cgroup v2 (plugin cgroup/v2): `/<CgroupSlice>/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`
  (`task_special` for processes added to a step without a task, `step_<step>/slurm` for
  slurmstepd itself). CgroupSlice is `system.slice` unless cgroup.conf says otherwise; a
  slurmd built with multiple-slurmd support names the scope `<NodeName>_slurmstepd.scope`.
- cgroup v1 (plugin cgroup/v1), in each controller's hierarchy:
  `/slurm/uid_<uid>/job_<id>/step_<step>[/task_<n>]` (`/slurm_<NodeName>/...` with multiple
  slurmd).

`<step>` is `batch` (the batch script), `extern` (the extern step; pam_slurm_adopt puts ssh
sessions there), `interactive` (salloc's), a step number, or `<n>+<m>` (a heterogeneous
step's component). `<id>` is the job's own id (SLURM_JOB_ID), also for a task of a job
array: the cgroup says `job_1235`, never the `1234_7` (<array id>_<task id>) squeue shows, so
job_id joins sacct's JobIDRaw.

A job is recognised only where slurmstepd puts it, because anyone with a delegated cgroup
subtree (systemd user delegation, rootless containers, a job's own task cgroup) can create
cgroups named `job_<victim>`: the slice (v2) or `slurm[_<node>]` (v1) must be the first element
of the path, a child of the root cgroup that only root can create, or the first after the `..`
of a path relative to the reader's cgroup namespace, a child of one of the reader's ancestors
(v2 may start there at the scope too: the reader runs in the scope's slice). A slurmd in a
container, seen from outside it (`/system.slice/docker-<id>.scope/system.slice/...`), is not
recognised. Cgroups a job creates below its step (a container it runs) are still that job's.

Slurm 26.05 names a job's cgroup after its SLUID on cgroup v2 (`sEKNKTV3WPV500`, which does not
encode the job id) unless cgroup.conf sets CgroupJobIdPaths=yes: such a process has no job_id.
"""

from __future__ import annotations

import re

_SLICE = re.compile(r"[^/]+\.slice")
_SCOPE = re.compile(r"(?:[^/]+_)?slurmstepd\.scope")
_V1_ROOT = re.compile(r"slurm(?:_[^/]+)?")
_UID = re.compile(r"uid_[0-9]+")
_JOB = re.compile(r"job_(?P<id>[1-9][0-9]{0,9})")  # job_%u: a job id is never 0
_STEP = re.compile(r"step_(?:batch|extern|interactive|[0-9]{1,10}(?:\+[0-9]{1,10})?)")


def _below(elements: list[str]) -> str:
    """The job of elements that start below the scope (v2) or below uid_<uid> (v1):
    job_<id>/step_<step>/..., as slurmstepd puts a job's processes only in its steps."""
    if len(elements) < 2:
        return ""
    job = _JOB.fullmatch(elements[0])
    return job.group("id") if job is not None and _STEP.fullmatch(elements[1]) else ""


def job_id(path: str) -> str:
    """The Slurm job id of one cgroup path ("/..." or namespace-relative "/../..."); "" where
    slurmstepd did not put the process (see the module docstring)."""
    elements = [e for e in path.split("/") if e]
    relative = bool(elements) and elements[0] == ".."
    while elements and elements[0] == "..":
        elements.pop(0)
    if len(elements) < 3:
        return ""
    first, second = elements[0], elements[1]
    if _V1_ROOT.fullmatch(first) and _UID.fullmatch(second):  # v1: slurm[_<node>]/uid_<uid>/job_<id>/step_<step>
        return _below(elements[2:])
    if _SLICE.fullmatch(first) and _SCOPE.fullmatch(second):  # v2, from the slice
        return _below(elements[2:])
    if relative and _SCOPE.fullmatch(first):  # v2, relative, from the scope: the reader is in that slice
        return _below(elements[1:])
    return ""
