#!/bin/bash
# one.sh REP COMPRESSION...
P=/work/main/.venv/bin/python
D=/tmp/c59/raw
r=$1; shift
for c in "$@"; do
  $P benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 4 --scale-links --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --compression $c --json $D/t_${c}_$r.json
done
