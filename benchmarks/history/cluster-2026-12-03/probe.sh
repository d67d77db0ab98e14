#!/bin/bash
P=/work/main/.venv/bin/python
D=/tmp/c59/raw
$P benchmarks/cluster_probe.py --hosts 2 4 --rates 1gbit 10gbit --scale-links --json $D/probe.json
$P benchmarks/cluster_probe.py --compute --hosts 2 4 --json $D/compute1.json
