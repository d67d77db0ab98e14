#!/bin/bash
cd /work/wt/cluster59/benchmarks
timeout 280 /work/main/.venv/bin/python simgrid_scale.py --emulated /tmp/c59/raw/probe.json /tmp/c59/raw/compute1.json /tmp/c59/raw/t_*.json /tmp/c59/raw/r_*.json
