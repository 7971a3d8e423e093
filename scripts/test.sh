#!/usr/bin/env bash
# Installs everything the tests need, then runs them. Extra arguments go to every pytest run.
#
#   1. the full suite on the system python3 (.venv, newest dependencies);
#   2. the fast tests (-m "not e2e": no exporter subprocess, no Prometheus; see tests/conftest.py)
#      on the lowest supported Python with the lowest declared dependency versions
#      (.venv-3.10, constraints/minimum.txt), and on the highest (.venv-3.13, newest versions).
#
# The stages run at once: stage 2's venvs are installed and tested in the background while
# stage 1 runs, each logging to a file that is printed when it ends (most tests wait on
# subprocesses, not on the CPU). Every pytest runs on pytest-xdist workers:
# RESMON_TEST_WORKERS (default: twice the CPUs) for stage 1, and half as many for each fast
# stage; RESMON_TEST_WORKERS=0 runs every stage serially in this process, one after another.
# The exit status is 1 when any stage failed.
#
# With CI=true nothing may be left out: a missing tool, header or interpreter is an error, and
# tests/ci_policy.py turns every skipped test into a failure. Without CI, a missing extra Python
# is reported and its stage left out; RESMON_EXTRA_PYTHONS="" leaves stage 2 out entirely.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${CI:-}" in true | TRUE | True | 1 | yes) ci=1 ;; *) ci=0 ;; esac
extra_pythons="${RESMON_EXTRA_PYTHONS-3.10 3.13}"
if [ "$ci" = 1 ]; then extra_pythons="3.10 3.13"; fi  # CI always runs the whole matrix

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
die() { echo "test.sh: $*" >&2; exit 1; }
stage_start=$SECONDS
stage_done() { echo "test.sh: $1: $((SECONDS - stage_start)) s" >&2; stage_start=$SECONDS; }

# -- system tools ----------------------------------------------------------------------------
# Debian's prometheus (prometheus, promtool), prometheus-alertmanager (alertmanager, amtool),
# docker-compose (offline validation of docker-compose.yml), gcc (the fake NVML), binutils
# (readelf, the fake's symbol check), systemd (systemd-analyze, the unit's checks) and fuse3
# (the amdgpu tests' FUSE sysfs), when missing. kubectl (with its built-in kustomize) is not
# in Debian in a usable version: these machines ship it, and CI=true fails at once without it.
missing=()  # Debian packages to install
tools=()    # the commands they bring, for the message where apt-get is not there
need() { command -v "$1" >/dev/null 2>&1 || { tools+=("$1"); shift; missing+=("$@"); }; }
need promtool prometheus
need prometheus-alertmanager prometheus-alertmanager
need docker-compose docker-compose
need gcc gcc libc6-dev
need readelf binutils
need systemd-analyze systemd
need fusermount3 fuse3  # the amdgpu tests' FUSE sysfs (libfuse3-3 comes with it)
need flock util-linux   # this script: one venv install at a time
need setsid util-linux  # this script: each background stage in its own process group
if ! command -v kubectl >/dev/null 2>&1; then
  [ "$ci" = 1 ] && die "kubectl >= 1.21 (kustomize Components) missing: tests/test_kubernetes_manifests.py needs it"
  echo "note: kubectl missing; the manifest tests are skipped" >&2
fi
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    die "missing ${tools[*]}, and no apt-get to install them (Debian's ${missing[*]}): install them with this system's package manager (prometheus, alertmanager, docker-compose, gcc, binutils, systemd, fuse3) or put them on PATH, then run this again"
  fi
  if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; then
    die "missing ${tools[*]}: run this as root or with sudo available, or install Debian's ${missing[*]} first"
  fi
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/resmon-test.XXXXXX")
pids=()      # the background stages, each the leader of its own process group (setsid)
stages=()    # their names, in the same order
# a stage still running when this script ends (Ctrl-C, a kill, an error) goes with it, its
# pytest, workers and exporters included
stop_stages() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop_stages EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- virtual environments --------------------------------------------------------------------
# make_venv DIR PYTHON [PIP ARGS...]: DIR with the test extra (and PIP ARGS, e.g. constraints)
make_venv() {
  local dir=$1 python=$2
  shift 2
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
  # one install at a time: each writes resmon_exporter.egg-info into this checkout, and the
  # venvs of stage 2 are installed at once (in the background)
  flock "$logs/install.lock" "$dir/bin/python" -m pip install -q "$@" -e ".[test]"
  # NVIDIA's official nvml.h (proprietary licence: installed at test time, never committed);
  # the fake NVML is compiled against it in tests/test_fake_nvml.py.
  if ! "$dir/bin/python" -m pip install -q nvidia-nvml-dev; then
    [ "$ci" = 1 ] && die "nvidia-nvml-dev could not be installed into $dir (CI=true: its test may not be skipped)"
    echo "note: nvidia-nvml-dev could not be installed into $dir; the header-checked build of the fake NVML is skipped" >&2
  fi
}

# find_python 3.10: that interpreter from pyenv (these CI machines have one), else from PATH
find_python() {
  local version=$1 root candidate
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for candidate in "$root"/versions/"$version".*/bin/python "$(command -v "python$version" || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# -- the stages ------------------------------------------------------------------------------
# the extra interpreters first: under CI=true a missing one fails now, not after stage 1
extras=()  # "version python" pairs
for version in $extra_pythons; do
  if ! python=$(find_python "$version"); then
    [ "$ci" = 1 ] && die "Python $version not found (looked in $(pyenv root 2>/dev/null || echo ~/.pyenv)/versions and PATH)"
    echo "note: Python $version not found; its fast tests are left out" >&2
    continue
  fi
  extras+=("$version $python")
done

cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
workers=${RESMON_TEST_WORKERS:-$((2 * cpus))}
case "$workers" in '' | *[!0-9]*) die "RESMON_TEST_WORKERS must be a number of workers, not '$workers'" ;; esac
# -n 0: no workers, the tests run in pytest's own process (what RESMON_TEST_WORKERS=0 asks).
# --dist loadfile: each file on one worker, its tests in order: a module's fixture (a
# Prometheus stack, a fleet of exporters) is started once, and test_fleet.py's last test checks
# what the ones before it left
xdist=(-p xdist -n "$workers" --dist loadfile)
fast_xdist=(-p xdist -n "$(((workers + 1) / 2))" --dist loadfile)
[ "$workers" = 0 ] && fast_xdist=(-p xdist -n 0)

# fast_stage VERSION PYTHON [PYTEST ARGS...]: .venv-VERSION installed, then its fast tests
fast_stage() {
  local version=$1 python=$2 constraints=() start=$SECONDS
  shift 2
  # the oldest Python gets the oldest dependency versions pyproject.toml declares
  [ "$version" = 3.10 ] && constraints=(-c constraints/minimum.txt)
  make_venv ".venv-$version" "$python" "${constraints[@]}"
  echo "test.sh: install .venv-$version ($("$python" -V)${constraints:+, minimum versions}): $((SECONDS - start)) s" >&2
  start=$SECONDS
  local rc=0
  ".venv-$version/bin/python" -m pytest -m "not e2e" "${fast_xdist[@]}" "$@" || rc=$?
  echo "test.sh: fast tests on Python $version: $((SECONDS - start)) s" >&2
  return "$rc"
}

failed=()
background=1
[ "$workers" = 0 ] && background=0  # serial: one stage after another, as before
make_venv .venv python3
stage_done "install .venv ($(.venv/bin/python -V))"

# -- 2. fast tests on the lowest and highest supported Python, in the background --------------
if [ "$background" = 1 ]; then
  export -f fast_stage make_venv die
  export ci logs
  for extra in "${extras[@]}"; do
    read -r version python <<<"$extra"
    # setsid: its own process group, so stop_stages can end the whole stage
    FAST_XDIST="${fast_xdist[*]}" setsid bash -c 'set -euo pipefail; read -ra fast_xdist <<<"$FAST_XDIST"; fast_stage "$@"' \
      fast_stage "$version" "$python" "$@" >"$logs/$version.log" 2>&1 </dev/null &
    pids+=($!)
    stages+=("fast tests on Python $version")
  done
fi

# -- 1. full suite, system python -------------------------------------------------------------
# its own process group as well, waited for with `wait`, which a signal interrupts (a foreground
# command would hold the INT/TERM traps until it ended): Ctrl-C or a kill ends every stage now
setsid .venv/bin/python -m pytest "${xdist[@]}" "$@" &
full=$!
pids+=("$full")
rc=0
wait "$full" || rc=$?
unset 'pids[-1]'
[ "$rc" = 0 ] || failed+=("full suite on $(.venv/bin/python -V)")
stage_done "full suite on $(.venv/bin/python -V)"

if [ "$background" = 1 ]; then
  for i in "${!stages[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    echo "test.sh: ---- ${stages[$i]} (background; its output) ----" >&2
    cat "$logs/${extras[$i]%% *}.log" >&2
    [ "$rc" = 0 ] || failed+=("${stages[$i]}")
  done
  pids=()
  stage_done "background stages"
else
  for extra in "${extras[@]}"; do
    read -r version python <<<"$extra"
    fast_stage "$version" "$python" "$@" || failed+=("fast tests on Python $version")
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: all passed" >&2
