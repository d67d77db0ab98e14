#!/bin/bash
/tmp/c59/acc.sh "$@"
/tmp/c59/diag.sh > /tmp/c59/raw/diag_$1_$2.txt 2>&1
