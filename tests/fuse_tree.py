"""The FUSE sysfs of the errno tests (amdgpu, intel): tests/fuse_sysfs.py serving a fake tree
at a mount point with rules that answer an errno or block, the fixture that mounts it, and
bounded(), which turns a read a wedged daemon never answers into a failure, not a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

from fake_sysfs import FakeSysfs

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


class FuseTree:
    """tests/fuse_sysfs.py serving a fake tree at a mount point, with rules. close() always
    unmounts (lazily: a wedged daemon cannot block it) and kills the daemon."""

    def __init__(self, base: Path, tree: FakeSysfs) -> None:
        self.tree = tree
        self.mount = base / "mnt"
        self.mount.mkdir()
        self.rules_path = base / "rules.json"
        self.log = base / "reads.log"
        self.log.write_text("")
        self.errors = base / "fuse.stderr"
        with open(self.errors, "w") as err:  # a file, not a pipe: a chatty daemon never blocks on it
            self.proc = subprocess.Popen([sys.executable, str(HERE / "fuse_sysfs.py"), str(tree.root), str(self.mount),
                                          str(self.rules_path), str(self.log)], stderr=err)
        try:
            deadline = time.monotonic() + 20
            while not os.path.ismount(self.mount):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"FUSE mount failed: {self.errors.read_text()}")
                time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    def rel(self, pci: str, name: str) -> str:
        """name: a device file ("mem_info_vram_used", "tile0/gt0/freq0/act_freq", "drm/card1/gt/..."),
        or "hwmon:<file>" in the card's hwmon."""
        board = self.tree.boards[pci]
        d = self.tree.device_dir(pci)
        path = d / "hwmon" / f"hwmon{board.hwmon_index}" / name[6:] if name.startswith("hwmon:") else d / name
        return str(path.relative_to(self.tree.root))

    def rules(self, rules: dict[tuple[str, str], dict], paths: dict[str, dict] | None = None) -> None:
        """rules by (card, file); paths: more, by path under the tree's root ("class/drm")."""
        tmp = self.rules_path.with_suffix(".tmp")
        by_path = {self.rel(pci, name): rule for (pci, name), rule in rules.items()}
        tmp.write_text(json.dumps({**by_path, **(paths or {})}))
        os.replace(tmp, self.rules_path)

    def reads(self, pci: str, name: str) -> int:
        return self.log.read_text().splitlines().count(self.rel(pci, name))

    def close(self) -> None:
        try:
            self.rules({})  # releases a hung read
            subprocess.run(["fusermount3", "-uz", str(self.mount)], check=False, timeout=30)
            self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


def mounted(tree: FakeSysfs, tmp_path: Path) -> Iterator[FuseTree]:
    """The body of a test file's fuse_tree fixture (over its own tree fixture)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing: this kernel or container has no FUSE (the errno tests need it)")
    ft = FuseTree(tmp_path, tree)
    try:
        yield ft
    finally:
        ft.close()


def bounded(fn: Callable[[], T], timeout: float = 60.0) -> T:
    """fn() on another thread: a read through the mount that a wedged FUSE daemon never
    answers fails this test instead of hanging the suite (there is no pytest-timeout)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        pytest.fail(f"a read through the FUSE mount did not return within {timeout} s: the daemon is wedged")
    if errors:
        raise errors[0]
    return out[0]
