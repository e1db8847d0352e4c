"""Benchmark: CPU instructions per record of the worker's per-record path, by cachegrind (issue 37).

    python benchmarks/instructions.py                        # every case, the build installed
    PROCESSOR_PURE_PYTHON=1 python benchmarks/instructions.py --cases table_filter

Runs ``benchmarks/engine_path.py`` under ``valgrind --tool=cachegrind --cache-sim=no`` twice per
case (``--small`` and ``--large`` records over the same generated data, ``PYTHONHASHSEED=0``) and
prints ``(Ir(large) - Ir(small)) / (large - small)``: start-up, set-up and imports cancel, the
commits and librdkafka's and RocksDB's threads stay in. Unlike a timing, the count does not move
with the machine's load, so two builds (or two commits) compare within ~1% on a shared machine.
Needs valgrind (Debian's ``valgrind``); each run takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instructions(case: str, records: int, generate: int) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, str(HERE / "engine_path.py"), "--records", str(records), "--generate", str(generate),
           "--repeat", "1", "--cases", case]
    out = subprocess.run(cmd, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{case} ({records} records) failed under cachegrind:\n{out.stderr[-3000:]}")
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if m is None:
        raise SystemExit(f"no instruction count in cachegrind's output:\n{out.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="table_filter,stream_filter,count")
    ap.add_argument("--small", type=int, default=4_000)
    ap.add_argument("--large", type=int, default=16_000)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from processor._compiled import build_info

    print(f"build: {build_info()}")
    for case in args.cases.split(","):
        small = instructions(case, args.small, args.large)
        large = instructions(case, args.large, args.large)
        print(f"{case:>14}: {(large - small) / (args.large - args.small):>10,.0f} instructions/record", flush=True)


if __name__ == "__main__":
    main()
