#!/usr/bin/env bash
# One-time set-up on a fresh machine: the Fashion-MNIST package and a venv with distnn and
# MPI (mpi4py + the mpich wheel): what the README's main job needs. With --test, also
# PyTorch CPU and the test tools (and Slurm's packages for the Slurm test): what the test
# suite needs. With --simgrid (or with --test), also Debian's SimGrid bindings for `distnn plan
# --simulate` (the system Python's; distnn runs the replay under it). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=mpi
SIMGRID=""
case "${1:-}" in
    --test) EXTRAS=mpi,test; SIMGRID=1 ;;
    --simgrid) SIMGRID=1 ;;
    "") ;;
    *) echo "setup.sh: unknown argument '$1'; use no argument (the main job), --test or --simgrid" >&2
       exit 2 ;;
esac
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y dataset-fashion-mnist >/dev/null 2>&1 \
        || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y dataset-fashion-mnist >/dev/null; }
fi
# Debian's fortunes: the default corpus of --dataset text (data/text.py), 2.8 MB.
if [ ! -d /usr/share/games/fortunes ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y fortunes >/dev/null 2>&1 \
        || { $SUDO apt-get update >/dev/null 2>&1 && $SUDO apt-get install -y fortunes >/dev/null 2>&1; } \
        || echo "setup.sh: could not install fortunes (--dataset text then needs --dataset_path)" >&2
fi
# Slurm and munge for tests/cluster/test_slurm.py (srun on the emulated cluster; skipped
# without them). Debian's packages install in seconds; their services need a slurm.conf
# in /etc/slurm, which this does not write. DISTNN_NO_SLURM=1 leaves them out.
if [ "$EXTRAS" != mpi ] && [ -z "${DISTNN_NO_SLURM:-}" ] && ! command -v slurmctld >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    PKGS="slurmctld slurmd slurm-client munge"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PKGS >/dev/null 2>&1 \
        || { $SUDO apt-get update >/dev/null 2>&1 \
             && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PKGS >/dev/null 2>&1; } \
        || echo "setup.sh: could not install $PKGS (the Slurm test will be skipped)" >&2
fi
# SimGrid (python3-simgrid, 3.32 on Debian 12) for `distnn plan --simulate`: optional, a
# binary package (the index's simgrid is a long C++ build). Without it --simulate says so.
if [ -n "$SIMGRID" ] && ! /usr/bin/python3 -c "import simgrid" >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-simgrid >/dev/null 2>&1 \
        || { $SUDO apt-get update >/dev/null 2>&1 \
             && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-simgrid >/dev/null 2>&1; } \
        || echo "setup.sh: could not install python3-simgrid (distnn plan --simulate then says so)" >&2
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[$EXTRAS]"
# pip byte-compiles what it installs, but not an editable install's source: without this,
# where PYTHONDONTWRITEBYTECODE is set every process (each rank of every job) compiles
# distnn's modules again, about 0.25 CPU-s each (measured here: a distnn command that stops
# at a bad option, 0.61 -> 0.36 CPU-s). A stale file after an edit is only recompiled.
.venv/bin/python -m compileall -q -j 0 src benchmarks examples tests >/dev/null
# The same for what pip installed into the venv: where pip leaves it uncompiled (here it
# wrote no .pyc at all), every process that imports torch compiles torch's Python source
# again. Measured on this 2-core host under load: `import torch` 7.3 -> 3.6 CPU-s, in
# each rank of every tests/torch job. Done once; a re-run only checks the files' times.
# Some packages ship files that do not compile (templates, other Pythons): not an error.
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
