"""The scrape of three fake machines, normalised, for comparing two trees line for line.

A refactor of a backend must not change what is served. This starts the real CLI on the fake
libnvidia-ml.so.1 (tests/fake_nvml) for the health machine, the MIG + GPM machine and the
three-GPU machine of tests/scenarios.py, scrapes each with every cache off
(--collect.cache-ttl=0, --collect.slow-interval=0: every scrape reads everything), and writes
the exposition with the values of inherently time-varying families replaced by "<varies>",
plus `--help`, one file each, into --out. Run it once on each tree and diff the folders:

    python benchmarks/scrape_equivalence.py --out /tmp/before --pythonpath /tmp/base-pkgs
    python benchmarks/scrape_equivalence.py --out /tmp/after
    diff -r /tmp/before /tmp/after

--pythonpath is prepended to PYTHONPATH of the exporter it starts (a folder in which
`resmon_exporter` is a link to another tree's exporter/ runs that tree). Run it twice on one
tree to see that the normalised output is deterministic.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import scenarios  # noqa: E402  (tests/ on the path first)
from fakenvml import Exporter, Scenario, Scrape, build_fake, nvml_env  # noqa: E402

# Families whose values depend on wall time or on this process, not on the machine: their
# series (labels) are kept and compared, their values are not.
VARYING = frozenset({
    "resmon_collector_duration_seconds",  # how long this scrape's parts took
    "resmon_last_refresh_timestamp_seconds",  # when the refresh ran
    "resmon_gpu_slow_read_timestamp_seconds",  # when a GPU's slow part was read
    "resmon_gpu_busy_seconds_total",  # the fake's utilization samples integrated over wall time
    "resmon_scrape_duration_seconds",
    "process_cpu_seconds_total",  # the exporter process itself (prometheus_client's process collector)
    "process_start_time_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "python_gc_objects_collected_total",
    "python_gc_collections_total",
    "python_gc_objects_uncollectable_total",
})
# One series whose value the fake makes the GPM sample window itself, in seconds (tests/scenarios.py).
VARYING_SERIES = ('resmon_gpu_mig_pcie_bandwidth_bytes_per_second{direction="receive",gpu="0",gpu_instance_id="2",',)
FLAGS = ("--collect.cache-ttl=0", "--collect.slow-interval=0", "--no-collector.host",
         "--collector.health", "--collector.nvlink", "--collector.profiling", "--collector.mig",
         "--collector.processes", "--collector.xid")


def has_window(s: Scrape) -> bool:
    """The GPM machine serves its profiling ratios once a sample window exists."""
    return s.has("resmon_gpu_sm_active_ratio", gpu="1") and len(s.series("resmon_gpu_mig_sm_active_ratio")) == 2


MACHINES: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[Scrape], bool]]] = {
    "health": (scenarios.health_machine, lambda s: True),
    "profiling": (scenarios.profiling_machine, has_window),
    "three_gpus": (scenarios.three_gpus, lambda s: True),
}


def family(line: str) -> str:
    name = re.split(r"[{ ]", line, maxsplit=1)[0]
    for suffix in ("_bucket", "_count", "_sum", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in VARYING:
            return name[: -len(suffix)]
    return name


def normalise(text: str) -> str:
    out = []
    for line in text.splitlines():
        # the fake's processes are this script's and its parent's (tests/scenarios.py)
        line = line.replace(f'pid="{os.getpid()}"', 'pid="<harness-pid>"')
        line = line.replace(f'pid="{os.getppid()}"', 'pid="<harness-parent-pid>"')
        if line and not line.startswith("#") and (family(line) in VARYING or line.startswith(VARYING_SERIES)):
            line = line.rsplit(" ", 1)[0] + " <varies>"
        out.append(line)
    return "\n".join(out) + "\n"


def scrape_machine(name: str, lib: Path, work: Path, env_extra: dict[str, str]) -> str:
    values, ready = MACHINES[name]
    scenario = Scenario(work / f"{name}.scenario", values())
    env = {**nvml_env(lib, scenario), **env_extra}
    exporter = Exporter(FLAGS, env)
    try:
        exporter.wait_listening()
        exporter.wait_ready()
        exporter.wait_for(ready, timeout=30.0)
        exporter.scrape()  # a second full read: counters and sample integrals past their first answer
        return normalise(exporter.scrape().text)
    finally:
        exporter.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for <machine>.txt and help.txt")
    parser.add_argument("--pythonpath", default="", help="prepended to the exporter's PYTHONPATH")
    args = parser.parse_args()
    env_extra = {}
    if args.pythonpath:
        env_extra["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scrape-equivalence-") as tmp:
        work = Path(tmp)
        lib = build_fake(work / "lib")
        started = time.monotonic()
        for name in MACHINES:
            (args.out / f"{name}.txt").write_text(scrape_machine(name, lib, work, env_extra))
        help_text = subprocess.run([sys.executable, "-m", "resmon_exporter", "--help"], capture_output=True,
                                   env={**os.environ, **env_extra}, check=True).stdout
        (args.out / "help.txt").write_bytes(help_text)
    print(f"wrote {len(MACHINES) + 1} files to {args.out} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
