"""Benchmark: the memory of a worker holding 1M keys of state, with default settings.

    python benchmarks/memory.py                 # local Tansu broker, 1,000,000 keys
    python benchmarks/memory.py --keys 200000 --bootstrap-servers host:9092

Loads N distinct keys (small JSON values) into a 4-partition topic, then runs a worker in a
child process (so that nothing of the loader is counted) that materializes the topic as a table
(RocksDB, changelogs on) and filters it to an output topic, until drained. Prints the child's
peak resident set (VmHWM), its resident set at the end, the state directory's size on disk and
the rate. Target (issue 16): under 500 MB with default settings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import add_child_arguments, broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402


def load(bootstrap, topic, n):
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(n):
        v = json.dumps({"n": i, "owner": f"customer-{i % 5000}", "balance": i % 977}, separators=(",", ":")).encode()
        produce(p, topic, v, f"account-{i:08d}".encode())
    p.flush()


def _status(field: str) -> int:
    """A /proc/self/status field in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def child(args) -> None:
    from processor.runtime.worker import Worker
    from processor.state.rocksdb import configure_memory

    configure_memory(args.block_cache_mb, args.write_buffer_mb)

    b = StreamsBuilder()
    b.table(args.topic, store_name="accounts").filter(lambda k, v: v["balance"] % 2 == 0).to_stream().to(args.out)
    w = Worker(b.build(), args.bootstrap_servers, args.app, args.state,
               consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    w.run(until_drained=True, install_signal_handlers=False)
    print(json.dumps({"processed": w.records_processed, "seconds": w.last_record_at - w.first_record_at,
                      "hwm_kb": _status("VmHWM"), "rss_kb": _status("VmRSS"),
                      "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--block-cache-mb", type=int, default=None, help="as processor run --state-block-cache-mb")
    ap.add_argument("--write-buffer-mb", type=int, default=None, help="as processor run --state-write-buffer-mb")
    add_child_arguments(ap)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        inp, out = f"bench-accounts-{run_id}", f"bench-even-{run_id}"
        kafka.create_topics(bootstrap, {inp: 4, out: 4})
        t0 = time.monotonic()
        load(bootstrap, inp, args.keys)
        print(f"loaded {args.keys:,} distinct keys into {inp} (4 partitions) in {time.monotonic() - t0:.1f} s")
        with tempfile.TemporaryDirectory() as state:
            proc = subprocess.run([sys.executable, __file__, "--child", "--bootstrap-servers", bootstrap,
                                   "--topic", inp, "--out", out, "--app", f"bench-memory-{run_id}",
                                   "--state", state,
                                   *(["--block-cache-mb", str(args.block_cache_mb)] if args.block_cache_mb else []),
                                   *(["--write-buffer-mb", str(args.write_buffer_mb)] if args.write_buffer_mb else [])],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"the worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            disk = _du(Path(state))
        mb = 1024
        print(f"worker: {r['processed']:,} records in {r['seconds']:.1f} s "
              f"({r['processed'] / r['seconds']:,.0f} records/s), {args.keys:,} keys of table state "
              f"({disk / 2**20:,.0f} MB on disk)")
        settings = ("default settings" if not (args.block_cache_mb or args.write_buffer_mb) else
                    f"block cache {args.block_cache_mb or 128} MB, write buffer {args.write_buffer_mb or 64} MB")
        print(f"memory with {settings}: peak RSS {r['hwm_kb'] / mb:,.0f} MB, RSS at the end "
              f"{r['rss_kb'] / mb:,.0f} MB (target: under 500 MB)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
