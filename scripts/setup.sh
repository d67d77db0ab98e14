#!/usr/bin/env bash
# One-time set-up on a fresh machine: the Fashion-MNIST package and a venv with distnn,
# MPI (mpi4py + the mpich wheel), PyTorch CPU and the test tools. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y dataset-fashion-mnist >/dev/null 2>&1 \
        || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y dataset-fashion-mnist >/dev/null; }
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[mpi,test]'
