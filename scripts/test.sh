#!/usr/bin/env bash
# Installs everything the tests need into .venv (and Debian's prometheus for promtool),
# then runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian's prometheus (prometheus, promtool), prometheus-alertmanager (alertmanager, amtool)
# and docker-compose (offline validation of docker-compose.yml), when missing.
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v gcc >/dev/null 2>&1 || { as_root apt-get update -qq; as_root apt-get install -y -qq gcc libc6-dev >/dev/null; }

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test]"
# NVIDIA's official nvml.h (proprietary licence: installed at test time, never committed);
# the fake NVML is compiled against it when it is there.
.venv/bin/python -m pip install -q nvidia-nvml-dev \
  || echo "note: nvidia-nvml-dev could not be installed; the header-checked build of the fake NVML is skipped"

exec .venv/bin/python -m pytest "$@"
