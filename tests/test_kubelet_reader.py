"""KubeletReader in-process against a real gRPC kubelet: the cache, the bounded wait for a
List, the back-off after a timeout, a restarted kubelet, logging once, and what counts as
"no kubelet"."""

from __future__ import annotations

import logging
import os
import threading
import time

import grpc

from resmon_exporter.attribution import kubelet as kubelet_module
from resmon_exporter.attribution.kubelet import KubeletReader
from fake_kubelet import Container, Device, FakeKubelet, Pod

PODS = [Pod("ns", "p", [Container("c", [Device("nvidia.com/gpu", ["GPU-1"])])])]
NEW = [Pod("ns", "q", [Container("c", [Device("nvidia.com/gpu", ["GPU-2"])])])]






def ids(state) -> list[str]:
    return [a.device_id for a in state.allocations]


def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_cached_for_the_ttl_and_fresh_after_it(kubelet, log):
    kubelet.pods = PODS
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.5, 2.0, log[0])
    first = reader.read(2.0)
    assert first is not None and first.success and ids(first) == ["GPU-1"]
    for _ in range(5):
        assert reader.read(2.0) is first  # within the TTL: no new List
    assert kubelet.calls == 1
    time.sleep(0.6)
    kubelet.pods = NEW
    assert ids(reader.read(2.0)) == ["GPU-2"]  # stale: a new List, answered within the wait
    assert kubelet.calls == 2


def test_a_slow_answer_is_served_to_the_next_read(kubelet, log):
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.0, 5.0, log[0])
    first = reader.read(2.0)
    kubelet.pods, kubelet.delay = NEW, 0.5
    started = time.monotonic()
    assert reader.read(0.1) is first  # the new List is late: the previous answer, at once
    assert time.monotonic() - started < 0.4
    until(lambda: ids(reader.read(0.0)) == ["GPU-2"])  # and the next read has the new one


def test_a_hung_kubelet_costs_one_wait_and_backs_off_5s_even_with_ttl_0(kubelet, log):
    kubelet.delay = 30.0
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.0, 0.3, log[0])
    started = time.monotonic()
    state = reader.read(0.1)
    assert time.monotonic() - started < 0.4
    assert state is not None and not state.success and state.timestamp_seconds is None  # no List has finished
    time.sleep(0.5)  # the List's own 0.3 s timeout has passed
    until(lambda: reader.read(0.0).timestamp_seconds is not None)
    for _ in range(20):
        assert not reader.read(0.1).success
        time.sleep(0.1)
    assert kubelet.calls == 1  # not asked again within 5 s of the timeout
    deadline = time.monotonic() + 6.0
    while kubelet.calls < 2 and time.monotonic() < deadline:
        reader.read(0.0)  # after the 5 s pause a read asks again
        time.sleep(0.05)
    assert kubelet.calls == 2
    warnings = [m for m in log[1].messages(logging.WARNING) if "kubelet" in m]
    assert len(warnings) == 1, warnings


def test_each_failing_list_is_not_logged_again_and_recovery_once(kubelet, log):
    kubelet.status = grpc.StatusCode.UNAVAILABLE
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.0, 1.0, log[0])
    for n in range(1, 5):
        assert not reader.read(1.0).success
        until(lambda: kubelet.calls >= n)
    kubelet.status = None
    until(lambda: reader.read(1.0).success)
    assert reader.read(1.0).success
    assert len([m for m in log[1].messages(logging.WARNING) if "failed" in m]) == 1
    assert len([m for m in log[1].messages(logging.INFO) if "answering again" in m]) == 1


def test_a_restarted_kubelet_is_asked_at_once_and_the_old_answer_dropped(kubelet, log):
    kubelet.delay = 30.0
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 5.0, 1.0, log[0])
    assert not reader.read(0.1).success  # a List to the hung kubelet is in flight (for 1 s)
    os.unlink(kubelet.socket_path)  # it restarts: the old process keeps its connection
    new = FakeKubelet(kubelet.socket_path)
    new.pods = NEW
    new.start()
    try:
        state = reader.read(2.0)  # a new socket inode: a new List to the new kubelet, at once
        assert state.success and ids(state) == ["GPU-2"] and new.calls == 1
        time.sleep(1.2)  # the old call has timed out; its answer must not replace the new one
        state = reader.read(0.0)
        assert state.success and ids(state) == ["GPU-2"]
    finally:
        new.stop()  # first: the old server's stop would unlink the path the new one is bound to


def test_a_restart_ends_the_back_off(kubelet, log):
    kubelet.delay = 30.0
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.0, 0.2, log[0])
    reader.read(0.0)
    until(lambda: reader.read(0.0).timestamp_seconds is not None)  # timed out: back-off of 5 s
    kubelet.stop()
    kubelet.delay = 0.0
    kubelet.start()
    started = time.monotonic()
    until(lambda: reader.read(0.5).success, timeout=3.0)
    assert time.monotonic() - started < 3.0


def test_a_directory_or_a_file_is_no_kubelet(tmp_path, log):
    (tmp_path / "dir.sock").mkdir()
    (tmp_path / "file.sock").write_text("")
    for path in (tmp_path / "dir.sock", tmp_path / "file.sock", tmp_path / "missing.sock", tmp_path / "file.sock" / "x"):
        assert KubeletReader(str(path), 0.0, 1.0, log[0]).read(0.5) is None, path


def test_a_path_that_cannot_be_looked_up_is_a_failure_not_absence(kubelet, log, monkeypatch):
    kubelet.start()

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(kubelet_module.os, "stat", denied)
    reader = KubeletReader(kubelet.socket_path, 0.0, 1.0, log[0])
    state = reader.read(0.5)
    assert state is not None and not state.success and kubelet.calls == 0
    assert any("uid 0" in r.resmon_fields["error"] for r in log[1].records if r.levelno == logging.WARNING)


def test_no_thread_left_is_a_failed_list_not_an_exception(kubelet, log, monkeypatch):
    kubelet.start()

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    reader = KubeletReader(kubelet.socket_path, 0.0, 1.0, log[0])
    state = reader.read(0.5)
    assert state is not None and not state.success
    monkeypatch.undo()
    until(lambda: reader.read(1.0).success)


def test_a_file_fifo_or_directory_at_the_socket_path_is_warned_once_by_name(tmp_path, log):
    """Something that is not a socket at the path: still no kubelet, but one warning that
    names the path and what is there, not silence."""
    (tmp_path / "dir.sock").mkdir()
    (tmp_path / "file.sock").write_text("")
    os.mkfifo(tmp_path / "fifo.sock")
    for name, kind in (("dir.sock", "directory"), ("file.sock", "regular file"), ("fifo.sock", "FIFO")):
        path = str(tmp_path / name)
        before = len(log[1].records)
        reader = KubeletReader(path, 0.0, 1.0, log[0])
        for _ in range(3):
            assert reader.read(0.1) is None
        warnings = [r for r in log[1].records[before:] if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        found = warnings[0].resmon_fields
        assert found["socket"] == path and found["found"] == kind, found
    (tmp_path / "gone.sock").write_text("")
    reader = KubeletReader(str(tmp_path / "gone.sock"), 0.0, 1.0, log[0])
    before = len(log[1].records)
    os.unlink(tmp_path / "gone.sock")
    assert reader.read(0.1) is None  # nothing there: the bare host's normal case, silent
    assert not [r for r in log[1].records[before:] if r.levelno == logging.WARNING]


def test_start_imports_grpc_where_the_socket_exists_not_on_the_first_list(kubelet):
    """The first List must not pay grpc's import (about 0.1 s, the whole kubelet wait of a
    refresh) under load: the monitor imports it at start when the socket exists, and never
    without the socket (the bare host saves its memory)."""
    kubelet.start()
    code = (
        "import sys\n"
        "from resmon_exporter.monitor import ResourceMonitor\n"
        "m = ResourceMonitor(collect_gpu=False, pod_resources_socket=sys.argv[1])\n"
        "m.start()\n"
        "print('grpc' in sys.modules)\n"
        "m.close()\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    import subprocess
    import sys

    for path, imported in ((kubelet.socket_path, "True"), (kubelet.socket_path + ".missing", "False")):
        result = subprocess.run([sys.executable, "-c", code, path], cwd=root, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == imported, (path, result.stdout, result.stderr)
