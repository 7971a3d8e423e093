#!/usr/bin/env bash
# See the GPU side without a GPU: the real exporter on a simulated machine.
#
#   scripts/demo.sh [h100|mig|amd|intel] [--listen HOST:PORT | --port PORT]
#
#   h100   8 H100s; real processes on GPUs 0-1 attributed to 2 pods (a fake kubelet) and a
#          Slurm job; utilization patterns, a power swing on GPU 3, an XID about once a minute
#   mig    an H100 in MIG mode, an H200 with GPM profiling, an A100 with MIG off
#   amd    a Radeon RX 7900 and an Instinct MI300X (a fake amdgpu sysfs tree)
#   intel  a Meteor Lake iGPU, an Arc A770 and a Data Center GPU Max 1550 (a fake sysfs tree)
#
# Every value is SIMULATED: the NVIDIA machines run on the test suite's fake libnvidia-ml.so.1
# (tests/fake_nvml/, built here with gcc), the AMD and Intel ones on its fake sysfs trees. The
# exporter listens on 127.0.0.1:9636 unless told otherwise; Ctrl-C (or SIGTERM) stops it and
# everything the demo started. Needs: python3 with the exporter installed (the repository's
# .venv when there is one, else $PYTHON or python3), gcc for h100 and mig, and for the pods of
# h100 grpcio-tools (pip install -e '.[test]'). The code is demo/ (python -m demo).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
cd "$root"
# exec: the demo is this process, so a signal sent to it reaches the code that stops the rest
exec "$python" -m demo "$@"
