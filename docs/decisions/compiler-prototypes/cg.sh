#!/bin/bash
# one cachegrind run: build case n -> prints "build case n Ir"
b=$1; case=$2; n=$3
[ "$b" = cyg4 ] && exit 0   # (dropped for time)
case $b in pure) path=/work/wt/compile;; *) path=/work/wt/compile-builds/$b;; esac
cd /tmp
ir=$(PYTHONHASHSEED=0 PYTHONPATH=$path valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
  /work/wt/compile-venv/bin/python /work/wt/compile/benchmarks/engine_path.py --records $n --generate 16000 --repeat 1 --cases $case 2>&1 \
  | grep -E "I\s+refs" | sed 's/.*refs: *//; s/,//g')
echo "$b $case $n $ir"
