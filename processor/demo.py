"""``processor demo``: the whole product on a real broker in one command.

Starts the local Tansu broker (unless ``--bootstrap-servers`` is given), creates topics,
produces an order data set (Avro values in Confluent framing, with updates, exact-duplicate
updates, deletes and one poison record), runs the example topology through the worker until the
input is drained, reads every topic back from the broker, checks the output against the
TopologyTestDriver on the same input, prints a summary and exits.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time

from processor import Emit, StreamsBuilder, TimeWindows
from processor.engine.task import dlq_topic_for
from processor.graph import AggregateAttrs
from processor.kafka import clients as kafka
from processor.runtime.local_broker import LocalBroker
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

ORDER_SERDE = Serdes.avro("order", schema_id=1)
CUSTOMER_SERDE = Serdes.avro("customer", schema_id=2)
STATUSES = ["NEW", "PAID", "SHIPPED", "CANCELLED"]


WINDOW = TimeWindows.of(10_000).grace(2_000)


def enrich(order, customer):
    return {"order": order["id"], "amount": order["amount"], "status": order["status"],
            "customer": None if customer is None else customer["name"],
            "region": None if customer is None else customer["region"]}


def demo_topology(orders_topic: str, big_topic: str, status_topic: str,
                  revenue_topic: str = "revenue", status_counts_topic: str = "status-counts",
                  windows_topic: str = "updates-per-order", customers_topic: str = "customers",
                  enriched_topic: str = "orders-enriched"):
    """Orders of 100.00 or more, as a table; each order's status as a string; revenue per
    customer (emitted on change) and orders per status (emitted on every update), both
    aggregated through repartition topics; updates per order per 10 s window, emitted once per
    window when it closes (2 s grace; later records are dropped and counted); every order
    enriched with its customer's name and region by a foreign-key left join (KIP-213)."""
    b = StreamsBuilder()
    orders = b.table(orders_topic, key_serde=Serdes.string(), value_serde=ORDER_SERDE)
    customers = b.table(customers_topic, key_serde=Serdes.string(), value_serde=CUSTOMER_SERDE)
    orders.join_on_foreign_key(customers, lambda v: v["customer_id"], enrich, how="left",
                               name="orders-with-customer") \
        .to_stream().to(enriched_topic)
    orders.filter(lambda k, v: v["amount"] >= 10_000, name="big-orders-filter") \
        .to_stream().to(big_topic)
    orders.map_values(lambda v: v["status"], value_serde=Serdes.string(), name="status-of") \
        .to_stream().to(status_topic)
    orders.group_by(lambda k, v: (v["customer_id"], v["amount"])) \
        .aggregate(lambda: 0, lambda k, v, total: total + v, lambda k, v, total: total - v,
                   emit=Emit.on_change(), name="revenue-by-customer") \
        .to_stream().to(revenue_topic)
    orders.group_by(lambda k, v: (v["status"], v["id"])) \
        .count(emit=Emit.on_update(), name="orders-by-status") \
        .to_stream().to(status_counts_topic)
    orders.to_stream().group_by_key().windowed_by(WINDOW) \
        .count(emit=Emit.on_window_close(), name="updates-per-order-10s") \
        .to_stream().to(windows_topic)
    return b.build()


def demo_input(n: int, seed: int = 7) -> list[tuple[bytes, bytes | None, int]]:
    """(key bytes, value bytes or None, timestamp): inserts, updates, duplicates, deletes, 1 poison."""
    rnd = random.Random(seed)
    rows: dict[str, dict] = {}
    out: list[tuple[bytes, bytes | None, int]] = []
    ts = 1_700_000_000_000
    for i in range(n):
        ts += rnd.randrange(1, 50)
        late = 15_000 if i % 97 == 96 else 0   # now and then a record 15 s late
        if i == n // 2:
            out.append((b"order-poison", b"\x00\x00\x00\x00\x01\xff not avro", ts))
            continue
        key = f"order-{rnd.randrange(max(1, n // 5)):04d}"
        r = rnd.random()
        if key in rows and r < 0.08:
            del rows[key]
            out.append((key.encode(), None, ts - late))
            continue
        if key in rows and r < 0.16:
            value = dict(rows[key])  # exact duplicate: a no-op update
        elif key in rows:
            value = dict(rows[key], amount=max(0, rows[key]["amount"] + rnd.randrange(-6000, 6000)),
                         status=rnd.choice(STATUSES))
        else:
            value = {"id": key, "customer_id": f"cust-{rnd.randrange(50):02d}",
                     "amount": rnd.randrange(200, 20_000), "status": "NEW"}
        rows[key] = value
        out.append((key.encode(), ORDER_SERDE.serialize(value), ts - late))
    return out


def demo_customers(seed: int = 8) -> list[tuple[bytes, bytes | None, int]]:
    """Customers cust-00..cust-44 (cust-45..49 never exist: their orders join nothing), then
    renames, region moves and a few deletes, spread over the orders' time range."""
    rnd = random.Random(seed)
    regions = ["eu", "us", "apac", "latam"]
    ts = 1_700_000_000_000
    out: list[tuple[bytes, bytes | None, int]] = []
    for i in range(45):
        c = {"id": f"cust-{i:02d}", "name": f"customer {i}", "region": rnd.choice(regions)}
        out.append((c["id"].encode(), CUSTOMER_SERDE.serialize(c), ts + i))
    for j in range(120):
        i = rnd.randrange(45)
        ts2 = ts + 1_000 + j * 400
        if rnd.random() < 0.05:
            out.append((f"cust-{i:02d}".encode(), None, ts2))
        else:
            c = {"id": f"cust-{i:02d}", "name": f"customer {i} v{j}", "region": rnd.choice(regions)}
            out.append((c["id"].encode(), CUSTOMER_SERDE.serialize(c), ts2))
    return out


def _fmt(v, width=60):
    s = repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


def demo_topic_names(run: str) -> tuple[str, ...]:
    """The demo's topics for one run id: orders, big orders, status, revenue, status counts,
    updates per order, customers, enriched orders."""
    return (f"orders-{run}", f"big-orders-{run}", f"order-status-{run}", f"revenue-{run}",
            f"status-counts-{run}", f"updates-per-order-{run}", f"customers-{run}", f"orders-enriched-{run}")


def topology_from_env():
    """The demo topology over the topics of run ``$DEMO_RUN`` (``processor demo --run-id``): what
    ``processor backfill processor.demo:topology_from_env`` rebuilds (docker-compose ``backfill``)."""
    run = os.environ.get("DEMO_RUN")
    if not run:
        raise ValueError("set DEMO_RUN to the run id given to `processor demo --run-id`")
    return demo_topology(*demo_topic_names(run))


def run_demo(bootstrap_servers: str | None = None, records: int = 2000, show: int = 5,
             run_id: str | None = None, describe: bool = False) -> int:
    broker = None
    t_start = time.monotonic()
    if not bootstrap_servers:
        broker = LocalBroker().start()
        bootstrap_servers = broker.bootstrap_servers
        print(f"started local broker (tansu) at {bootstrap_servers}")
    try:
        run = run_id or time.strftime("%H%M%S")
        app = f"demo-{run}"
        names = demo_topic_names(run)
        t_orders, t_big, t_status, t_revenue, t_counts, t_windows, t_customers, t_enriched = names
        kafka.create_topics(bootstrap_servers, {t: 4 for t in names})
        data = demo_input(records)
        customers = demo_customers()
        p = kafka.new_producer(kafka.producer_defaults(bootstrap_servers), "the demo's input")
        for k, v, ts in customers[:45]:
            p.produce(t_customers, v, k, timestamp=ts)
        for i, (k, v, ts) in enumerate(data):
            p.produce(t_orders, v, k, timestamp=ts)
            if i % 16 == 0 and 45 + i // 16 < len(customers):   # customer updates among the orders
                ck, cv, cts = customers[45 + i // 16]
                p.produce(t_customers, cv, ck, timestamp=cts)
        for ck, cv, cts in customers[45 + (len(data) + 15) // 16:]:
            p.produce(t_customers, cv, ck, timestamp=cts)
        p.flush()
        del p
        topo = demo_topology(*names)
        print(f"\nproduced {len(data):,} records to {t_orders} (4 partitions): "
              f"{sum(v is None for _, v, _ in data)} deletes, 1 poison record; "
              f"{len(customers)} records to {t_customers} (4 partitions)\n")
        if describe:
            print(topo.describe())
        with tempfile.TemporaryDirectory(prefix="processor-demo-") as state:
            w = Worker(topo, bootstrap_servers, app, state, commit_interval_ms=500,
                       consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
            w.run(until_drained=True, install_signal_handlers=False)
        print(f"worker processed {w.records_processed:,} records (throughput: see benchmarks/)\n")

        # What the same input gives in the broker-free test driver, partition by partition.
        # Table operators are per partition (compared key by key, in order); aggregates mix
        # partitions through repartition topics (their final tables are compared).
        expected: dict[str, list] = {t_big: [], t_status: [], t_windows: []}
        input_msgs = kafka.read_topic(bootstrap_servers, t_orders)
        by_part = _by_partition(input_msgs)
        logging.getLogger("processor.task").disabled = True  # the poison record was reported above
        for part_records in by_part:
            with TopologyTestDriver(demo_topology(*names), application_id=app) as d:
                for m in part_records:
                    d.pipe_raw(t_orders, m.key(), m.value(), m.timestamp()[1])
                for t in expected:
                    expected[t].extend((r.key, r.value) for r in d.read_output(t, Serdes.bytes(), Serdes.bytes()))
        expected_final: dict[str, dict] = {}
        customer_msgs = kafka.read_topic(bootstrap_servers, t_customers)
        with TopologyTestDriver(demo_topology(*names), application_id=app) as d:
            for m in customer_msgs:   # the final tables do not depend on the interleaving
                d.pipe_raw(t_customers, m.key(), m.value(), m.timestamp()[1])
            for m in input_msgs:
                d.pipe_raw(t_orders, m.key(), m.value(), m.timestamp()[1])
        for t in (t_revenue, t_counts, t_enriched):
            expected_final[t] = {}
            for r in d.read_output(t):
                if r.value is None:
                    expected_final[t].pop(r.key, None)
                else:
                    expected_final[t][r.key] = r.value

        logging.getLogger("processor.task").disabled = False
        print(f"{'topic':<24}{'records':>9}  sample")
        summary_ok = True
        for topic, serde in ((t_orders, ORDER_SERDE), (t_big, ORDER_SERDE), (t_status, Serdes.string()),
                             (t_revenue, Serdes.json()), (t_counts, Serdes.json()), (t_windows, Serdes.json()),
                             (t_customers, CUSTOMER_SERDE), (t_enriched, Serdes.json()),
                             (dlq_topic_for(app), None)):
            msgs = {t_orders: input_msgs, t_customers: customer_msgs}.get(topic) \
                or kafka.read_topic(bootstrap_servers, topic)
            print(f"{topic:<24}{len(msgs):>9}")
            for m in msgs[:show]:
                if topic == t_windows:
                    key = Serdes.windowed(Serdes.string(), WINDOW.size_ms).deserialize(m.key())
                else:
                    key = m.key().decode("utf-8", "replace") if m.key() else None
                if serde is None:
                    hdrs = {h.rpartition(".")[2]: v.decode() for h, v in (m.headers() or [])
                            if h in ("__streams.errors.topic", "__streams.errors.partition",
                                     "__streams.errors.offset")}
                    val = f"{_fmt(m.value(), 30)} headers={hdrs}"
                else:
                    try:
                        val = _fmt(serde.deserialize(m.value()))
                    except Exception:
                        val = f"<{len(m.value())} bytes that do not deserialize>"
                print(f"{'':<24}{'':>9}  {key}: {val}")
            if topic in expected:
                got = sorted(((m.key(), m.value()) for m in msgs), key=lambda kv: kv[0])
                want = sorted(expected[topic], key=lambda kv: kv[0])
                # per key, in order (sorted() is stable, so each key keeps its sequence)
                same = got == want
                summary_ok &= same
                print(f"{'':<24}{'':>9}  equals the test driver's output, key by key and in order: "
                      f"{'yes' if same else 'NO'}")
            if topic in expected_final:
                assert serde is not None   # the dead-letter topic has no expected final table
                final: dict[str, object] = {}
                for m in msgs:
                    if m.value() is None:
                        final.pop(m.key().decode(), None)
                    else:
                        final[m.key().decode()] = serde.deserialize(m.value())
                same = final == expected_final[topic]
                summary_ok &= same
                print(f"{'':<24}{'':>9}  final table ({len(final)} keys) equals the test driver's: "
                      f"{'yes' if same else 'NO'}")
        metrics = w.metrics()
        if describe:
            print("\ncounters:")
            for node, counters in metrics.items():
                print(f"  {node}: " + ", ".join(f"{k}={v:,}" for k, v in counters.items()))
        print()
        print(operator_report(topo, metrics))
        print("\naggregations (emission policy: records in -> records emitted):")
        for node in topo.nodes:
            if isinstance(node.attrs, AggregateAttrs) and node.name in metrics:
                m = metrics[node.name]
                late = f", {m['late_records_dropped']:,} late records dropped" if "late_records_dropped" in m else ""
                print(f"  {node.stores[0]:<22} {node.attrs.emit!r:<20} {m['records_in']:>7,} in -> "
                      f"{m['records_emitted']:>7,} emitted  ({m['noop_updates_skipped']:,} no-op updates "
                      f"skipped, {m['emissions_deferred']:,} deferred{late})")
        fk = {n: metrics.get(n.name, {}) for n in topo.nodes if n.name.startswith("KTABLE-FK-JOIN-")}
        sent = sum(m.get("subscriptions_sent", 0) for m in fk.values())
        resp = sum(m.get("responses_sent", 0) for m in fk.values())
        stale = sum(m.get("stale_responses_dropped", 0) for m in fk.values())
        local = sum(m.get("resolved_locally", 0) for m in fk.values())
        coalesced = sum(metrics.get(n.name, {}).get("records_coalesced", 0) for n in topo.nodes
                        if n.sink_topic and getattr(n.attrs, "coalesce", None))
        print(f"\nforeign-key join orders -> customers: {sent:,} subscriptions, {resp:,} responses, "
              f"{local:,} resolved without a round trip, {stale:,} stale responses dropped; "
              f"{coalesced:,} subscription/response records replaced by a later one before the commit (not sent)")
        print(f"\ndemo finished in {time.monotonic() - t_start:.1f} s")
        return 0 if summary_ok else 1
    finally:
        if broker:
            broker.stop()


def operator_report(topo, metrics) -> str:
    """Per stateful operator: records in, records emitted, the result's real changes (updates that
    were not no-ops) and emitted / changes: the traffic the seeds remove (1.00: one record per
    real change; above: duplicates a naive operator would send; below: changes held back by the
    emission policy)."""
    rows = []
    for node in topo.nodes:
        m = metrics.get(node.name)
        if not m or "records_in" not in m:
            continue
        if node.kind == "table-source":
            what = f"table {node.stores[0] if node.stores else node.name}"
            emitted = m["records_in"] - m.get("noop_updates_skipped", 0)
        elif isinstance(node.attrs, AggregateAttrs):
            what = f"{node.stores[0]} {node.attrs.emit!r}"
            emitted = m.get("records_emitted", 0)
        else:
            continue
        changes = m["records_in"] - m.get("noop_updates_skipped", 0)
        rows.append((what, m["records_in"], emitted, changes))
    out = [f"{'operator':<46}{'in':>8}{'emitted':>9}{'changes':>9}{'emitted/changes':>17}"]
    for what, n_in, emitted, changes in rows:
        ratio = f"{emitted / changes:.2f}" if changes else "-"
        out.append(f"{what:<46}{n_in:>8,}{emitted:>9,}{changes:>9,}{ratio:>17}")
    return "\n".join(out)


def _by_partition(msgs):
    parts: dict[int, list] = {}
    for m in msgs:
        parts.setdefault(m.partition(), []).append(m)
    return [parts[p] for p in sorted(parts)]
