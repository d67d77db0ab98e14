#!/bin/bash
# rep22.sh REP "COMPRESSIONS" "RULES": one repetition of 2 hosts x 2 ranks; skips what would pass ~4 min
P=/work/main/.venv/bin/python
D=/work/notes/s4/cluster/raw
r=$1
T0=$SECONDS
for c in $2; do
  [ $((SECONDS-T0)) -gt 215 ] && { echo "SKIPPED t22_${c}_$r (time)" >&2; continue; }
  $P benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 --ranks-per-host 2 --scale-links --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --compression $c --json $D/t22_${c}_$r.json
done
for p in $3; do
  [ $((SECONDS-T0)) -gt 215 ] && { echo "SKIPPED r22_${p}_$r (time)" >&2; continue; }
  $P benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 --ranks-per-host 2 --scale-links --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --parallel $p --json $D/r22_${p}_$r.json
done
