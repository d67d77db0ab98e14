#!/bin/bash
# call.sh NAME SCRIPT ARGS...: one quiet call, logged (UTC start/end, commit, rc)
N=$1; shift
cd /work/wt/cluster59; export PYTHONPATH=$PWD/src
C=$(git rev-parse --short HEAD); S=$(date -u +%FT%TZ)
nice -n 19 /work/bin/quiet bash "$@" > /work/notes/s4/cluster/raw/$N.out 2> /work/notes/s4/cluster/raw/$N.err
rc=$?
echo "$N | $S -> $(date -u +%FT%TZ) | commit $C | rc $rc | $*" >> /work/notes/s4/cluster/log.txt
