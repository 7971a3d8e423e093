#!/usr/bin/env python3
"""Fake nvidia-smi / amd-smi (chosen by the name it is called as) for the gpu-tracker backend.

It answers exactly the argv forms gpu-tracker uses, from the JSON file named by
$FAKE_SMI_SCENARIO: {"nvidia": {...}, "amd": {...}}, each with
  "gpus": [{"uuid", "total_mib", "used_mib", "util"}]  (a value may be a string such as "[N/A]")
  "processes": [[pid, mib]], "stderr": text written to stderr on every query,
  "exit": exit code of queries, "bare_exit": exit code of the bare call, "sleep": seconds to hang.
A vendor missing from the file behaves as "installed but cannot connect" (bare call exits 9).
Every call is appended to $FAKE_SMI_TRACE as "<tool> <argv...> pid=<pid>". Unknown argv: exit 2.
"""

import json
import os
import sys
import time

tool = os.path.basename(sys.argv[0])
vendor = "amd" if tool == "amd-smi" else "nvidia"
args = sys.argv[1:]
trace = os.environ.get("FAKE_SMI_TRACE")
if trace:
    with open(trace, "a") as f:
        f.write(f"{tool} {' '.join(args)} pid={os.getpid()}\n")

with open(os.environ["FAKE_SMI_SCENARIO"]) as f:
    machine = json.load(f).get(vendor)
if machine is None:
    print(f"{tool}: failed to initialize: driver/library version mismatch", file=sys.stderr)
    sys.exit(9)
gpus = machine.get("gpus", [])


def unit(value, suffix):
    return value if isinstance(value, str) else f"{value}{suffix}"


def hang_and_noise():
    if machine.get("sleep"):
        time.sleep(float(machine["sleep"]))
    if machine.get("stderr"):
        print(machine["stderr"], file=sys.stderr)
    code = machine.get("exit", 0)
    if code:
        print(f"{tool}: query failed", file=sys.stderr)
        sys.exit(code)


if not args:
    if machine.get("sleep"):
        time.sleep(float(machine["sleep"]))
    print(f"fake {tool}: {len(gpus)} GPU(s)")
    sys.exit(machine.get("bare_exit", 0))

out = []
if vendor == "nvidia":
    if args == ["--query-gpu=uuid,memory.total", "--format=csv"]:
        out = ["uuid, memory.total [MiB]"] + [f"{g['uuid']}, {unit(g['total_mib'], ' MiB')}" for g in gpus]
    elif args == ["--query-gpu=uuid,memory.used,utilization.gpu", "--format=csv"]:
        out = ["uuid, memory.used [MiB], utilization.gpu [%]"] + [
            f"{g['uuid']}, {unit(g['used_mib'], ' MiB')}, {unit(g['util'], ' %')}" for g in gpus
        ]
    elif args == ["--query-compute-apps=pid,used_gpu_memory", "--format=csv"]:
        out = ["pid, used_gpu_memory [MiB]"] + [f"{p}, {m} MiB" for p, m in machine.get("processes", [])]
else:
    if args == ["list", "--csv"]:
        out = ["gpu,gpu_bdf,gpu_uuid"] + [f"{i},0000:{3 + i:02x}:00.0,{g['uuid']}" for i, g in enumerate(gpus)]
    elif args == ["static", "--vram", "--csv"]:
        out = ["gpu,type,vendor,size,bit_width"] + [f"{i},HBM,SAMSUNG,{g['total_mib']},8192" for i, g in enumerate(gpus)]
    elif args == ["monitor", "--vram-usage", "--gfx", "--csv"]:
        out = ["gpu,gfx,vram_used,vram_total"] + [
            f"{i},{g['util']},{g['used_mib']},{g['total_mib']}" for i, g in enumerate(gpus)
        ]
    elif args == ["process", "--csv"]:
        out = ["gpu,pid,name,vram_mem"] + [f"0,{p},python,{m * 1048576}" for p, m in machine.get("processes", [])]
if not out:
    print(f"{tool}: unknown arguments {args}", file=sys.stderr)
    sys.exit(2)
hang_and_noise()
print("\n".join(out))
