#!/usr/bin/env python3
"""A read-only FUSE passthrough of a fake sysfs tree that answers reads the way amdgpu can:
with an errno, or by blocking (a hung SMU). libfuse3 (Debian fuse3) through mfusepy.

    python fuse_sysfs.py SOURCE MOUNTPOINT RULES LOG

RULES is a JSON file, re-read when it changes: {"<path relative to SOURCE>": rule}, rule
{"errno": "EPERM"} (the open succeeds, read() fails, as sysfs show() errors do), or
{"hang": true} (read() blocks until the rule is removed; on a directory, its listing does, as
a hung sysfs or 9p/FUSE mount can block the /sys/class/drm listing). Every read is logged to LOG as
"<path>" (one line per read call, so a test can count them). Files report 4096 bytes as
sysfs attributes do; caching is off (direct_io, zero timeouts), as values change.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
import time

import mfusepy as fuse


class Sysfs(fuse.Operations):
    use_ns = True

    def __init__(self, source: str, rules: str, log: str) -> None:
        self.source = source
        self.rules_path = rules
        self.log_path = log
        self._rules: dict[str, dict] = {}
        self._stamp: float | None = None
        self._lock = threading.Lock()

    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def rules(self) -> dict[str, dict]:
        try:
            stamp = os.stat(self.rules_path).st_mtime_ns
        except FileNotFoundError:
            return {}
        if stamp != self._stamp:
            with open(self.rules_path) as f:
                self._rules, self._stamp = json.load(f), stamp
        return self._rules

    def getattr(self, path: str, fh: int | None = None) -> dict:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        out = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_mtime_ns", "st_ctime_ns", "st_atime_ns")}
        out["st_size"] = 4096 if stat.S_ISREG(st.st_mode) else st.st_size
        for key in ("st_mtime", "st_ctime", "st_atime"):
            out[key] = out.pop(key + "_ns")
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        self._hold(path.lstrip("/"))
        return [".", "..", *os.listdir(self._real(path))]

    def _hold(self, rel: str) -> dict | None:
        """Blocks while rel has a hang rule (at most 120 s); its rule after that."""
        deadline = time.monotonic() + 120
        while True:
            rule = self.rules().get(rel)
            if rule is None or not rule.get("hang") or time.monotonic() > deadline:
                return rule
            time.sleep(0.02)

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def open(self, path: str, flags: int) -> int:
        if not os.path.isfile(self._real(path)):
            raise fuse.FuseOSError(errno.ENOENT)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        rel = path.lstrip("/")
        with self._lock, open(self.log_path, "a") as log:
            log.write(rel + "\n")
        rule = self._hold(rel)
        if rule is not None and "errno" in rule:
            raise fuse.FuseOSError(getattr(errno, rule["errno"]))
        with open(self._real(path), "rb") as f:
            f.seek(offset)
            return f.read(size)


def main() -> None:
    source, mountpoint, rules, log = sys.argv[1:5]
    fuse.FUSE(Sysfs(source, rules, log), mountpoint, foreground=True, ro=True, direct_io=True,
              attr_timeout=0, entry_timeout=0, negative_timeout=0)


if __name__ == "__main__":
    main()
