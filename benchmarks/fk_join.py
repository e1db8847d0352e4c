"""Benchmark: a foreign-key table join (KIP-213) through the worker on a real broker.

    python benchmarks/fk_join.py                  # local Tansu broker, 100,000 order updates
    python benchmarks/fk_join.py --orders 300000 --customers 20000 --bootstrap-servers host:9092

Loads C customers (right table) and N order updates (left table: 20,000 orders whose customer
changes now and then, 5 % deletes) into two 4-partition topics, then runs
``orders.join_on_foreign_key(customers, ...)`` to an output topic until drained: every left
update is consumed, turned into a subscription (produced, consumed, stored under a CombinedKey,
answered by a response produced to the left row's partition, consumed, version-checked and
joined). Throughput is input records (orders + customers) per second from the first record
processed to the last (the group join excluded).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.runtime import kafka  # noqa: E402
from processor.runtime.local_broker import LocalBroker  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402


def produce(p, topic, key, value, ts):
    while True:
        try:
            p.produce(topic, value, key, timestamp=ts)
            return
        except BufferError:
            p.poll(0.05)


def load(bootstrap, orders, customers, n, c):
    rnd = random.Random(42)
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(c):
        produce(p, customers, f"cust-{i}".encode(),
                json.dumps({"name": f"customer {i}", "tier": i % 3}, separators=(",", ":")).encode(), 1)
    owner = {}
    for i in range(n):
        k = f"order-{rnd.randrange(20_000)}"
        if k in owner and rnd.random() < 0.05:
            del owner[k]
            produce(p, orders, k.encode(), None, 2 + i)
            continue
        if k not in owner or rnd.random() < 0.2:
            owner[k] = f"cust-{rnd.randrange(c)}"
        v = json.dumps({"customer": owner[k], "amount": rnd.randrange(10_000)}, separators=(",", ":")).encode()
        produce(p, orders, k.encode(), v, 2 + i)
    p.flush()


def topology(orders, customers, out):
    b = StreamsBuilder()
    b.table(orders).join_on_foreign_key(
        b.table(customers), lambda o: o["customer"],
        lambda o, cu: {"amount": o["amount"], "customer": cu["name"], "tier": cu["tier"]},
        name="orders-customers").to_stream().to(out)
    return b.build()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--customers", type=int, default=5_000)
    ap.add_argument("--bootstrap-servers")
    args = ap.parse_args()
    broker = None
    if not args.bootstrap_servers:
        broker = LocalBroker().start()
        bootstrap = broker.bootstrap_servers
    else:
        bootstrap = args.bootstrap_servers
    try:
        run_id = int(time.time())
        orders, customers, out = f"bench-orders-{run_id}", f"bench-customers-{run_id}", f"bench-enriched-{run_id}"
        kafka.create_topics(bootstrap, {orders: 4, customers: 4, out: 4})
        t0 = time.monotonic()
        load(bootstrap, orders, customers, args.orders, args.customers)
        total = args.orders + args.customers
        print(f"loaded {args.orders:,} order updates and {args.customers:,} customers (4 partitions each) "
              f"in {time.monotonic() - t0:.1f} s")
        with tempfile.TemporaryDirectory() as state:
            w = Worker(topology(orders, customers, out), bootstrap, f"bench-{run_id}", state,
                       consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
            t0 = time.monotonic()
            w.run(until_drained=True, install_signal_handlers=False)
            dt = w.last_record_at - w.first_record_at
            m = w.metrics()
        fk = {}
        for node, counters in m.items():
            if node.startswith("KTABLE-FK-JOIN-"):
                for k, v in counters.items():
                    fk[k] = fk.get(k, 0) + v
        print(f"worker: {w.records_processed:,} records processed (input + subscriptions + responses) in "
              f"{dt:.2f} s (group join and startup {w.first_record_at - t0:.1f} s excluded)")
        print("  " + ", ".join(f"{k}={v:,}" for k, v in sorted(fk.items()) if k != "left_version"))
        print(f"foreign-key join: {total / dt:,.0f} input records/s")
    finally:
        if broker:
            broker.stop()


if __name__ == "__main__":
    main()
