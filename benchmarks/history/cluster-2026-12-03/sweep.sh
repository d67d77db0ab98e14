#!/bin/bash
# usage: sweep.sh REP data|rules
cd /work/wt/cluster59
export PYTHONPATH=$PWD/src
PY=/work/main/.venv/bin/python
rep=$1
if [ "$2" = data ]; then
  for c in none fp16 topk:0.01 powersgd:2; do
    echo "== $(date -u +%H:%M:%S) rep $rep compression $c" >&2
    $PY benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 4 --scale-links \
      --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --compression $c \
      --json /tmp/c59/t_${c}_$rep.json > /tmp/c59/t_${c}_$rep.md
  done
else
  for r in $3; do
    echo "== $(date -u +%H:%M:%S) rep $rep rule $r" >&2
    $PY benchmarks/cluster.py --part throughput --models simplecnn --hosts 2 4 --scale-links \
      --rates 1gbit 10gbit --reps 1 --windows 5 --steps 20 --parallel $r \
      --json /tmp/c59/${RP:-r}_${r}_$rep.json > /tmp/c59/${RP:-r}_${r}_$rep.md
  done
fi
ip netns list >&2
if [ -n "$COMPUTE" ]; then
  echo "== $(date -u +%H:%M:%S) rep $rep compute copies" >&2
  $PY benchmarks/cluster_probe.py --compute --hosts 2 4 --steps 400 --json /tmp/c59/compute$rep.json > /tmp/c59/compute$rep.md
fi
