"""KubeletReader in-process against a real gRPC kubelet: the cache, the background List, the
back-off after a timeout, warning once, and what counts as "no kubelet"."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Iterator

import pytest

from exporter.kubernetes.kubelet import KubeletReader
from fake_kubelet import Container, Device, FakeKubelet, Pod, short_socket_dir

PODS = [Pod("ns", "p", [Container("c", [Device("nvidia.com/gpu", ["GPU-1"])])])]


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    directory = short_socket_dir()
    k = FakeKubelet(os.path.join(directory, "kubelet.sock"))
    k.pods = PODS
    yield k
    k.stop()
    shutil.rmtree(directory, ignore_errors=True)


def wait_calls(k: FakeKubelet, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while k.calls < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert k.calls >= n, k.calls


def test_cached_for_the_ttl_then_refreshed_in_the_background(kubelet, log):
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.5, 2.0, log[0])
    first = reader.read(2.0)
    assert first is not None and first.success and [a.device_id for a in first.allocations] == ["GPU-1"]
    for _ in range(5):
        assert reader.read(2.0) is first  # within the TTL: no new List
    assert kubelet.calls == 1
    time.sleep(0.6)
    kubelet.pods = []
    assert reader.read(2.0) is first  # stale: served as it is while the new List runs
    wait_calls(kubelet, 2)
    deadline = time.monotonic() + 5
    while reader.read(0.0).allocations and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reader.read(0.0).success and reader.read(0.0).allocations == ()


def test_a_hung_kubelet_is_not_waited_for_and_backs_off_even_with_ttl_0(kubelet, log):
    kubelet.delay = 30.0
    kubelet.start()
    reader = KubeletReader(kubelet.socket_path, 0.0, 0.3, log[0])
    started = time.monotonic()
    state = reader.read(0.2)  # waits only for the first answer, and only this long
    assert time.monotonic() - started < 1.0
    assert state is not None and not state.success
    time.sleep(0.6)  # the List's own 0.3 s timeout has passed
    for _ in range(10):
        assert not reader.read(0.2).success
    assert kubelet.calls == 1  # the timed-out kubelet is asked again only after 5 s
    warnings = [m for m in log[1].messages(logging.WARNING) if "kubelet" in m]
    assert len(warnings) == 1, warnings


def test_recovery_is_logged_once(kubelet, log):
    reader = KubeletReader(kubelet.socket_path, 0.0, 1.0, log[0])
    kubelet.start()
    kubelet.status = __import__("grpc").StatusCode.UNAVAILABLE
    assert not reader.read(2.0).success
    kubelet.status = None
    deadline = time.monotonic() + 5
    while not reader.read(0.0).success and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reader.read(0.0).success
    infos = [m for m in log[1].messages(logging.INFO) if "answering again" in m]
    assert len(infos) == 1


def test_a_directory_or_a_file_is_no_kubelet(tmp_path, log):
    (tmp_path / "dir.sock").mkdir()
    (tmp_path / "file.sock").write_text("")
    for path in (tmp_path / "dir.sock", tmp_path / "file.sock", tmp_path / "missing.sock", tmp_path / "file.sock" / "x"):
        assert KubeletReader(str(path), 0.0, 1.0, log[0]).read(0.5) is None, path
