#!/bin/bash
# rep.sh REP "COMPRESSIONS" "RULES": one repetition; skips what would pass ~4 min
P=/work/main/.venv/bin/python
D=/tmp/c59/raw
r=$1
T0=$SECONDS
for c in $2; do
  [ $((SECONDS-T0)) -gt 215 ] && { echo "SKIPPED t_${c}_$r (time)" >&2; continue; }
  $P benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 4 --scale-links --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --compression $c --json $D/t_${c}_$r.json
done
for p in $3; do
  [ $((SECONDS-T0)) -gt 215 ] && { echo "SKIPPED r_${p}_$r (time)" >&2; continue; }
  $P benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 4 --scale-links --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --parallel $p --json $D/r_${p}_$r.json
done
