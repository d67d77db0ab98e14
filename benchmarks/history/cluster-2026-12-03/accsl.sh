#!/bin/bash
P=/work/main/.venv/bin/python
$P /tmp/c59/sl.py > /tmp/c59/raw/sl_$1_$2.txt 2>&1
taskset -c 1 $P /tmp/c59/sl.py >> /tmp/c59/raw/sl_$1_$2.txt 2>&1
/tmp/c59/acc.sh "$@"
