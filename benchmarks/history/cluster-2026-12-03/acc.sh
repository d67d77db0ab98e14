#!/bin/bash
# acc.sh REP RATE [HOSTS] [ROWS]
P=/work/main/.venv/bin/python
D=/tmp/c59/raw
h=${3:-2}
rows=${4:-data,data+fp16,data+topk,data+powersgd,partial,localsgd,easgd,downpour,gossip}
$P benchmarks/cluster.py --part accuracy --rates $2 --acc-hosts $h --scale-links --epochs 2 --eval-every 50 --rules $rows --no-ddp --json $D/a_${h}_$2_$1.json
