"""Benchmark: a foreign-key table join (KIP-213) through the worker on a real broker.

    python benchmarks/fk_join.py                  # local Tansu broker, 100,000 order updates
    python benchmarks/fk_join.py --orders 300000 --customers 20000 --bootstrap-servers host:9092
    python benchmarks/fk_join.py --fanout 10       # right updates, each joined to 10 left rows

Loads C customers (right table) and N order updates (left table: 20,000 orders whose customer
changes now and then, 5 % deletes) into two 4-partition topics, then runs
``orders.join_on_foreign_key(customers, ...)`` to an output topic until drained: every left
update is consumed, turned into a subscription (produced, consumed, stored under a CombinedKey,
answered by a response produced to the left row's partition, consumed, version-checked and
joined). Throughput is input records (orders + customers) per second from the first record
processed to the last (the group join excluded).

``--fanout F`` measures the right side instead: C customers and F orders per customer (each
order's customer fixed), joined once; then every customer is updated ``--right-updates`` times
and a second run of the same worker (its state kept) processes only those updates: each one
answers F subscriptions with F responses and F joined rows. Throughput is right updates per
second (target, issue 16: 10,000/s with F=10), and the output is checked: every order's last
joined row carries its customer's last name.

``--coalesce on|off|both``: the worker holds foreign-key join records until its commit, a later
one of the same pair replacing an earlier (``processor/engine/fk_join_coalescing.py``); ``off``
sends every one, ``both`` (the default) runs the benchmark twice, on then off, each on its
own topics loaded the same way.
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

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402


def load(bootstrap, orders, customers, n, c):
    rnd = random.Random(42)
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(c):
        produce(p, customers, json.dumps({"name": f"customer {i}", "tier": i % 3}, separators=(",", ":")).encode(),
                f"cust-{i}".encode(), 1)
    owner = {}
    for i in range(n):
        k = f"order-{rnd.randrange(20_000)}"
        if k in owner and rnd.random() < 0.05:
            del owner[k]
            produce(p, orders, None, k.encode(), 2 + i)
            continue
        if k not in owner or rnd.random() < 0.2:
            owner[k] = f"cust-{rnd.randrange(c)}"
        v = json.dumps({"customer": owner[k], "amount": rnd.randrange(10_000)}, separators=(",", ":")).encode()
        produce(p, orders, v, k.encode(), 2 + i)
    p.flush()


def load_fanout(bootstrap, orders, customers, c, fanout):
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(c):
        produce(p, customers, json.dumps({"name": f"customer {i} v0", "tier": i % 3}, separators=(",", ":")).encode(),
                f"cust-{i}".encode(), 1)
    for j in range(c * fanout):
        v = json.dumps({"customer": f"cust-{j % c}", "amount": j % 10_000}, separators=(",", ":")).encode()
        produce(p, orders, v, f"order-{j}".encode(), 2)
    p.flush()


def update_customers(bootstrap, customers, c, rounds):
    p = Producer(kafka.producer_defaults(bootstrap))
    for r in range(1, rounds + 1):
        for i in range(c):
            produce(p, customers, json.dumps({"name": f"customer {i} v{r}", "tier": i % 3},
                                             separators=(",", ":")).encode(), f"cust-{i}".encode(), 10 + r)
    p.flush()


def modes(choice):
    return {"on": [True], "off": [False], "both": [True, False]}[choice]


def fk_counters(metrics):
    """The foreign-key join's counters, summed over its operators and tasks."""
    fk = {}
    for node, counters in metrics.items():
        if node.startswith("KTABLE-FK-JOIN-") or "records_coalesced" in counters:
            for k, v in counters.items():
                fk[k] = fk.get(k, 0) + v
    return ", ".join(f"{k}={v:,}" for k, v in sorted(fk.items()))


def fanout(bootstrap, args, run_id, coalesce):
    tag = f"{run_id}-{'coalesce' if coalesce else 'each'}"
    orders, customers, out = f"bench-orders-{tag}", f"bench-customers-{tag}", f"bench-enriched-{tag}"
    kafka.create_topics(bootstrap, {orders: 4, customers: 4, out: 4})
    c, f = args.customers, args.fanout
    load_fanout(bootstrap, orders, customers, c, f)
    print(f"loaded {c:,} customers and {c * f:,} orders ({f} per customer)")
    conf = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    with tempfile.TemporaryDirectory() as state:
        w = Worker(topology(orders, customers, out), bootstrap, f"bench-{tag}", state, consumer_config=conf,
                   coalesce_fk_records=coalesce)
        w.run(until_drained=True, install_signal_handlers=False)
        print(f"joined once: {w.records_processed:,} records processed")
        update_customers(bootstrap, customers, c, args.right_updates)
        updates = c * args.right_updates
        w = Worker(topology(orders, customers, out), bootstrap, f"bench-{tag}", state, consumer_config=conf,
                   coalesce_fk_records=coalesce)
        w.run(until_drained=True, install_signal_handlers=False)
        dt = w.last_record_at - w.first_record_at
        m = w.metrics()
    last = {}
    for msg in kafka.read_topic(bootstrap, out):
        last[msg.key()] = msg.value()
    want = f"v{args.right_updates}"
    wrong = sum(1 for v in last.values() if v is None or not json.loads(v)["customer"].endswith(want))
    on = "on" if coalesce else "off"
    print(f"worker (coalescing {on}): {updates:,} right updates -> {w.records_processed:,} records processed "
          f"(updates + responses) in {dt:.2f} s; orders whose last row is not their customer's last version: "
          f"{wrong} of {len(last):,}")
    print("  " + fk_counters(m))
    print(f"foreign-key join, fan-out {f}, coalescing {on}: {updates / dt:,.0f} right updates/s")
    if wrong or len(last) != c * f:
        sys.exit("wrong result")


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
    ap.add_argument("--fanout", type=int, default=0, help="measure right updates fanning out to F left rows")
    ap.add_argument("--right-updates", type=int, default=5, help="with --fanout: updates per customer")
    ap.add_argument("--coalesce", choices=("on", "off", "both"), default="both",
                    help="foreign-key join records held until the commit (default: both, on then off)")
    ap.add_argument("--bootstrap-servers")
    args = ap.parse_args()
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        for coalesce in modes(args.coalesce):
            if args.fanout:
                fanout(bootstrap, args, run_id, coalesce)
            else:
                left_updates(bootstrap, args, run_id, coalesce)


def left_updates(bootstrap, args, run_id, coalesce):
    tag = f"{run_id}-{'coalesce' if coalesce else 'each'}"
    orders, customers, out = f"bench-orders-{tag}", f"bench-customers-{tag}", f"bench-enriched-{tag}"
    kafka.create_topics(bootstrap, {orders: 4, customers: 4, out: 4})
    t0 = time.monotonic()
    load(bootstrap, orders, customers, args.orders, args.customers)
    total = args.orders + args.customers
    print(f"loaded {args.orders:,} order updates and {args.customers:,} customers (4 partitions each) "
          f"in {time.monotonic() - t0:.1f} s")
    with tempfile.TemporaryDirectory() as state:
        w = Worker(topology(orders, customers, out), bootstrap, f"bench-{tag}", state,
                   consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
                   coalesce_fk_records=coalesce)
        t0 = time.monotonic()
        w.run(until_drained=True, install_signal_handlers=False)
        dt = w.last_record_at - w.first_record_at
        m = w.metrics()
    on = "on" if coalesce else "off"
    print(f"worker (coalescing {on}): {w.records_processed:,} records processed (input + subscriptions + "
          f"responses) in {dt:.2f} s (group join and startup {w.first_record_at - t0:.1f} s excluded)")
    print("  " + fk_counters(m))
    print(f"foreign-key join, coalescing {on}: {total / dt:,.0f} input records/s")


if __name__ == "__main__":
    main()
