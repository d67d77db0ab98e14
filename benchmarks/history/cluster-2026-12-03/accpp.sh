#!/bin/bash
/tmp/c59/ppdiag.sh > /tmp/c59/raw/pp_$1_$2.txt 2>&1
/tmp/c59/acc.sh "$@"
