#!/bin/bash
# interleaved A/B: every round runs each build once, the order rotating per round
builds=(pure:/work/wt/compile cy:/work/wt/compile-builds/cy cyg4:/work/wt/compile-builds/cyg4 cyann:/work/wt/compile-builds/cyann mypyc:/work/wt/compile-builds/mypyc)
rounds=${ROUNDS:-5}
for r in $(seq 1 $rounds); do
  n=${#builds[@]}
  for i in $(seq 0 $((n-1))); do
    b=${builds[$(( (i + r) % n ))]}
    name=${b%%:*}; path=${b#*:}
    out=$(cd /tmp && PYTHONPATH=$path /work/wt/compile-venv/bin/python /work/wt/compile/benchmarks/engine_path.py --records ${RECORDS:-100000} --repeat 1 --json 2>&1 | tail -1)
    echo "$r $name $out"
  done
done
