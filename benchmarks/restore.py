"""Benchmark: restoring task stores from their changelogs.

    python benchmarks/restore.py                 # local Tansu broker, 500,000 keys
    python benchmarks/restore.py --keys 1000000 --bootstrap-servers host:9092

Builds the state of a 4-partition table of N distinct keys (~80-byte JSON values) with the
worker, so its store changelog holds N records, then restores it twice into empty state
directories:

1. ``ChangelogReader.restore`` (the restore alone: read every changelog to its end, write RocksDB);
2. a ``Worker`` started on the wiped state directory: the restore as the main loop runs it, in
   steps between polls of the group consumer, with the tasks paused until it is done (time from
   the assignment to the tasks resumed, from the worker's own log line).

Prints records/s for each (target: >= 200,000 records/s).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.changelog_reader import ChangelogReader, RestoreTarget  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402
from processor.serde import Serdes  # noqa: E402
from processor.state.rocksdb import RocksDBDatabase  # noqa: E402

PARTS = 4


def load(bootstrap, topic, keys):
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(keys):
        v = json.dumps({"amount": i % 977, "customer": f"customer-{i % 5000:05d}", "seq": i, "note": "x" * 20},
                       sort_keys=True, separators=(",", ":")).encode()
        produce(p, topic, v, f"key-{i:08d}".encode(), 1_700_000_000_000 + i)
    p.flush()


def topology(inp):
    b = StreamsBuilder()
    b.table(inp, key_serde=Serdes.string(), value_serde=Serdes.json(), store_name="in-store")
    return b.build()


class _Resumed(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def emit(self, record):
        m = re.search(r"restored and resumed .* after ([\d.]+) s", record.getMessage())
        if m:
            self.seconds.append(float(m.group(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=500_000)
    ap.add_argument("--bootstrap-servers")
    args = ap.parse_args()
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = time.time_ns()
        inp, app = f"restore-bench-in-{run_id}", f"restore-bench-{run_id}"
        kafka.create_topics(bootstrap, {inp: PARTS})
        t0 = time.monotonic()
        load(bootstrap, inp, args.keys)
        print(f"loaded {args.keys:,} records in {time.monotonic() - t0:.1f} s", flush=True)
        topo = topology(inp)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            Worker(topo, bootstrap, app, Path(tmp) / "build").run(until_drained=True, install_signal_handlers=False)
            print(f"state built by the worker in {time.monotonic() - t0:.1f} s", flush=True)
            bound = topo.for_application(app)
            conf = kafka.consumer_defaults(bootstrap)
            conf.update({"group.id": f"{app}-bench-restore"})
            targets = [RestoreTarget(RocksDBDatabase(Path(tmp) / "direct" / f"task-0_{p}"), f"0_{p}", p,
                                     bound.changelogs_of(0)) for p in range(PARTS)]
            t0 = time.monotonic()
            reader = ChangelogReader(conf)
            try:
                reader.restore(targets)
            finally:
                reader.close()
            direct_s = time.monotonic() - t0
            direct_n = sum(t.restored for t in targets)
            for t in targets:
                t.db.close()
            handler = _Resumed()
            logging.getLogger("processor.worker").addHandler(handler)
            logging.getLogger("processor.worker").setLevel(logging.INFO)
            w = Worker(topo, bootstrap, app, Path(tmp) / "fresh")
            w.run(until_drained=True, install_signal_handlers=False)
            loop_s = sum(handler.seconds)
            loop_n = w.restored_records
        print(f"ChangelogReader.restore: {direct_n:,} records in {direct_s:.2f} s = "
              f"{direct_n / direct_s:,.0f} records/s")
        print(f"worker main-loop restore: {loop_n:,} records in {loop_s:.2f} s = {loop_n / loop_s:,.0f} records/s "
              f"(target >= 200,000)")


if __name__ == "__main__":
    main()
