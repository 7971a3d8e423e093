"""The Dockerfile and .dockerignore, checked statically (no Docker engine here, nor in CI):
a base pinned by digest, a numeric non-root USER that is the non-root component's, outside the
uids that name system accounts or people and without a passwd entry, no HEALTHCHECK (Kubernetes probes
/-/healthy and /-/ready), the kubernetes extra by default and the gpu-tracker one off, EXPOSE
equal to the CLI's default port, the console script as the entrypoint, and a build context
that holds what COPY takes and none of the test script's venvs. Each check is also run on a
broken copy, so a check that cannot fail fails here."""

from __future__ import annotations

import io
import json
import re
import subprocess
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from resmon_exporter.cli import FLAGS
from resmon_exporter.version import __version__
from fakenvml import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
# the installed distribution's metadata (pyproject.toml as built; tomllib is not in Python 3.10)
DIST = distribution("resmon-exporter")
NON_ROOT = REPO / "deploy" / "kubernetes" / "components" / "non-root" / "kustomization.yaml"
# what a test run leaves beside the sources (scripts/test.sh's venvs above all: ~820 MB)
NEVER_SENT = [".venv/bin/python", ".venv-3.10/lib/x.py", ".venv-3.13/pyvenv.cfg", ".git/HEAD", "tests/test_image.py",
              "benchmarks/fleet.py", "exporter/__pycache__/cli.cpython-311.pyc", "build/lib/x.py",
              "resmon_exporter.egg-info/PKG-INFO", "tests/fakenvml/libnvidia-ml.so.1"]


def instructions(text: str) -> list[tuple[str, str]]:
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    return [(i["instruction"], i["value"]) for i in parser.structure if i["instruction"] != "COMMENT"]


def default_port() -> int:
    [flag] = [f for f in FLAGS if f.name == "web.listen-address"]
    return int(flag.default.rsplit(":", 1)[1])


def console_script() -> str:
    [script] = [e for e in DIST.entry_points if e.group == "console_scripts"]
    assert script.value == "resmon_exporter.cli:main"
    return script.name


def declared_extras() -> set[str]:
    return set(DIST.metadata.get_all("Provides-Extra") or ())


def non_root_id(field: str = "runAsUser") -> int:
    patches = yaml.safe_load(NON_ROOT.read_text())["patches"]
    text = "\n".join(p["patch"] for p in patches)
    [uid] = set(re.findall(rf"path: /spec/template/spec/securityContext/{field}\n\s+value: (\d+)", text))
    return int(uid)


def non_root_uid() -> int:
    return non_root_id("runAsUser")


# uids that name someone else: Debian's static system accounts and the ones adduser hands out
# inside the base (0-999), nobody (65534), and the ranges hosts give people, locally (1000-60000,
# login.defs) or from LDAP/SSSD (which commonly start at 10000): the image's uid shows up as a
# user name wherever the image's /etc/passwd names it, so it must be in none of them
TAKEN_UIDS = (range(0, 1000), range(1000, 60001), range(65534, 65536))
# what would give the image's uid a passwd entry (and so a name on host processes with that uid)
_MAKES_USER = re.compile(r"\b(useradd|adduser|groupadd|addgroup|usermod)\b|/etc/passwd|/etc/group")


def dockerfile_problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile's text, by this project's rules; [] when nothing is."""
    steps = instructions(text)
    problems = []
    kinds = [kind for kind, _ in steps]
    froms = [value for kind, value in steps if kind == "FROM"]
    if len(froms) != 1 or not re.fullmatch(r"\S+@sha256:[0-9a-f]{64}", froms[0]):
        problems.append(f"base not pinned by digest: {froms}")
    if "crane digest" not in text and "imagetools inspect" not in text:
        problems.append("no comment on how to update the base's digest")
    users = [value for kind, value in steps if kind == "USER"]
    if not users or not re.fullmatch(r"\d+:\d+", users[-1]) or int(users[-1].split(":")[0]) == 0:
        problems.append(f"last USER is not a numeric non-root uid:gid: {users}")  # runAsNonRoot can check only a number
    else:
        uid, gid = (int(n) for n in users[-1].split(":"))
        if uid != non_root_uid() or gid != non_root_id("runAsGroup"):
            problems.append(f"USER {users[-1]} is not the non-root component's runAsUser:runAsGroup "
                            f"{non_root_uid()}:{non_root_id('runAsGroup')}")
        if any(uid in taken for taken in TAKEN_UIDS):
            problems.append(f"USER {users[-1]}: uid {uid} is in a range that names system accounts or people")
    makes = [value for kind, value in steps if kind == "RUN" and _MAKES_USER.search(value)]
    if makes:
        # the image's /etc/passwd would name host processes of that uid (docs/metrics.md, "user")
        problems.append(f"a RUN gives a passwd or group entry: {makes}")
    if "HEALTHCHECK" in kinds:
        problems.append("HEALTHCHECK: Kubernetes ignores it and it fixes port and scheme")
    args = dict(value.split("=", 1) for kind, value in steps if kind == "ARG" and "=" in value)
    extras = [e for e in args.get("EXTRAS", "").split(",") if e]
    declared = declared_extras()
    if "kubernetes" not in extras:
        problems.append(f"EXTRAS default {extras} lacks kubernetes (the kubelet client)")
    if "gpu-tracker" in extras:
        problems.append("EXTRAS default has gpu-tracker (pandas, SQLAlchemy: ~190 MB)")
    if not set(extras) <= set(declared) - {"test"}:
        problems.append(f"EXTRAS default names extras pyproject.toml lacks: {sorted(set(extras) - set(declared))}")
    runs = " ".join(value for kind, value in steps if kind == "RUN")
    if not re.search(r'pip install "\.\$\{EXTRAS:\+\[\$EXTRAS\]\}"', runs):
        problems.append("the RUN does not install the package with ${EXTRAS}")
    exposed = [value for kind, value in steps if kind == "EXPOSE"]
    if exposed != [str(default_port())]:
        problems.append(f"EXPOSE {exposed} is not the CLI's default port {default_port()}")
    for kind, value in steps:
        if kind not in ("EXPOSE",) and re.search(rf"\b{default_port()}\b", value):
            problems.append(f"{kind} hard-codes the port: {value}")
    entrypoints = [value for kind, value in steps if kind == "ENTRYPOINT"]
    try:
        entrypoint = json.loads(entrypoints[-1]) if entrypoints else None
    except json.JSONDecodeError:
        entrypoint = entrypoints[-1]  # shell form: signals reach /bin/sh, not the exporter
    if entrypoint != [console_script()]:
        problems.append(f"ENTRYPOINT {entrypoint} is not [{console_script()!r}] in exec form")
    if "CMD" in kinds:
        problems.append("CMD: the exporter's flags are the user's (docker run ..., the manifests' args)")
    return problems


def test_the_dockerfile_keeps_the_rules() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def _sub(text: str, old: str, new: str) -> str:
    assert re.search(old, text, re.M), old
    return re.sub(old, new, text, count=1, flags=re.M)


@pytest.mark.parametrize("old, new, problem", [
    (r"@sha256:[0-9a-f]+", "", "pinned by digest"),
    (r"^FROM (\S+)@sha256:[0-9a-f]+", r"FROM \1@sha256:abc", "pinned by digest"),
    (r"crane digest", "crane", None),  # the other way is still named: no problem
    (r"^USER .*", "USER root", "numeric non-root"),
    (r"^USER .*", "USER 0:0", "numeric non-root"),
    (r"^USER .*", "USER 65533:65533", "runAsUser"),
    (r"^USER .*", "USER 1000:1000", "names system accounts or people"),
    (r"^USER .*", "USER 10001:10001", "names system accounts or people"),
    (r"^USER .*", "USER 65534:65534", "names system accounts or people"),
    (r"^USER (\d+):\d+", r"USER \1", "numeric non-root uid:gid"),
    (r"^USER .*\n", "", "numeric non-root"),
    (r"^(RUN pip install .*)", r"\1 && useradd --system --uid 65532 resmon", "passwd or group entry"),
    (r"^(RUN pip install .*)", r"\1 && echo 'resmon:x:65532:65532::/:/bin/false' >> /etc/passwd", "passwd or group entry"),
    (r"^EXPOSE .*", "EXPOSE 9636\nHEALTHCHECK CMD python -c 'import urllib.request'", "HEALTHCHECK"),
    (r"^ARG EXTRAS=.*", "ARG EXTRAS=kubernetes,gpu-tracker", "gpu-tracker"),
    (r"^ARG EXTRAS=.*", "ARG EXTRAS=", "lacks kubernetes"),
    (r"^ARG EXTRAS=.*", "ARG EXTRAS=kubernetes,k8s", "pyproject.toml lacks"),
    (r'pip install "\.\$\{EXTRAS:\+\[\$EXTRAS\]\}"', 'pip install "."', "${EXTRAS}"),
    (r"^EXPOSE .*", "EXPOSE 9100", "default port"),
    (r"^ENTRYPOINT .*", 'ENTRYPOINT ["python", "-m", "resmon_exporter"]', "exec form"),
    (r"^ENTRYPOINT .*", "ENTRYPOINT resmon-exporter", "exec form"),
    (r"^ENTRYPOINT .*", 'ENTRYPOINT ["resmon-exporter"]\nCMD ["--web.listen-address=:9636"]', "hard-codes the port"),
])
def test_each_rule_fails_a_dockerfile_that_breaks_it(old: str, new: str, problem: str | None) -> None:
    problems = dockerfile_problems(_sub(DOCKERFILE.read_text(), old, new))
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


# -- the build context -------------------------------------------------------------------------
def _pattern(line: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker reads it (Go's filepath.Match per path element, and
    `**` for any number of them); no library implements these rules for Python."""
    out = ""
    parts = re.split(r"(\*\*/?|\*|\?)", line.strip("/"))
    for part in parts:
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out)


def sent(ignore_text: str, path: str) -> bool:
    """Whether `path` (relative to the context) is in the build context: the last pattern that
    matches it or a directory above it decides; a `!` pattern lets it back in."""
    rules = [(l.startswith("!"), _pattern(l.lstrip("!"))) for l in ignore_text.splitlines()
             if l.strip() and not l.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = True
    for included, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            verdict = included
    return verdict


def copied_sources() -> list[str]:
    """Every tracked file the Dockerfile's COPY lines name (a directory: its tracked files)."""
    sources = []
    for kind, value in instructions(DOCKERFILE.read_text()):
        if kind == "COPY":
            sources += value.split()[:-1]
    tracked = subprocess.run(["git", "ls-files", *sources], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert {s for s in sources if (REPO / s).is_file()} <= set(tracked)
    return tracked


def test_the_build_context_holds_what_copy_takes_and_no_venv() -> None:
    ignore = DOCKERIGNORE.read_text()
    files = copied_sources()
    assert "exporter/cli.py" in files and "pyproject.toml" in files
    assert [f for f in files if not sent(ignore, f)] == []
    assert [p for p in NEVER_SENT if sent(ignore, p)] == []


def test_the_context_check_can_fail() -> None:
    ignore = DOCKERIGNORE.read_text()
    assert not sent(ignore + "\nexporter/backends\n", "exporter/backends/nvml/wanted.py")
    assert sent(ignore + "\nexporter/backends\n", "exporter/cli.py")
    assert sent(ignore.replace("**/__pycache__\n", ""), "exporter/__pycache__/cli.cpython-311.pyc")
    # the old file, which named each thing to leave out, sent the test script's venvs
    old = ".git\n.venv\n**/__pycache__\n*.egg-info\n"
    assert sent(old, ".venv-3.10/lib/x.py") and not sent(old, ".venv/bin/python")
    assert not sent("*\n!exporter\n", "pyproject.toml") and sent("*\n!exporter\n", "exporter/cli.py")
    assert sent("**/*.pyc\n", "README.md") and not sent("**/*.pyc\n", "a/b/c.pyc") and not sent("**/*.pyc\n", "c.pyc")


def test_compose_builds_this_image_with_its_own_health_check() -> None:
    """docker-compose.yml's exporters build this Dockerfile and check /-/healthy themselves,
    on the port they pass (the image has no HEALTHCHECK)."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    exporters = {name: s for name, s in services.items() if s.get("build") == "."}
    assert set(exporters) == {"exporter", "exporter-nogpu"}
    for name, service in exporters.items():
        test = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{default_port()}/-/healthy" in test, name
        assert service["image"] == f"resmon-exporter:{__version__}", name
