#!/bin/bash
P=/work/main/.venv/bin/python
D=/work/notes/s4/cluster/raw
$P benchmarks/cluster_probe.py --hosts 2 --ranks-per-host 2 --rates 1gbit 10gbit --scale-links --json $D/probe22.json
$P benchmarks/cluster_probe.py --compute --hosts 2 --ranks-per-host 2 --json $D/compute22.json
