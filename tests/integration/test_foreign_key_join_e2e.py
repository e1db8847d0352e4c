"""Foreign-key joins end to end on a real broker (KIP-213).

Orders (pk -> {"customer": fk, "n": int}) and customers (fk -> {"name", "tier", "visits"}) on 4
partitions each, 30,000 records produced through one producer with the two topics interleaved
in time. Orders move between customers quickly (hot orders many times), to customers that do
not exist, to no customer (fk None), and get deleted; customers are updated (some updates touch
only "visits", which the joiner ignores, so the results must not be re-emitted), re-sent
unchanged and deleted. One topology holds an inner and a left foreign-key join of the same two
tables. Most orders sit on another partition than their customer (checked with Kafka's murmur2,
itself checked against where the broker put every record).

The worker runs while the input arrives (chunks every 50 ms), so customer changes meet live
subscriptions and results: a worker started on pre-produced input reads each topic far ahead of
the other and of the internal topics, and the right-side paths barely run. The test therefore
waits until the group has committed every input and internal partition to its end (the same
"drained" as ``run(until_drained=True)``, seen from outside) and then stops the worker.

For each join: the final table in the output topic equals a from-scratch join of the final
input tables computed in plain Python, and the test driver's final table for the same input;
and per key the output keeps the table-operator invariant (no re-emitted unchanged result, no
tombstone for a key without a result)."""

import json
import random
import threading
import time
from collections import Counter, defaultdict

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.serde import subscription as wire
from processor.state import combined_key
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    final_table,
    key_partition,
    pipe_messages,
    produce_interleaved,
    table_emission_violations,
    wait_until_group_drained,
)

PARTS = 4
N = 30_000
ORDERS, HOT_ORDERS = 1_500, 150
CUSTOMERS, GHOSTS = 300, 40
LEFT_SHARE = 0.6


def _js(v) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


def fk_scenario(orders_topic: str, customers_topic: str, n: int = N, seed: int = 7):
    """``[(topic, key bytes, value bytes | None)]`` in production order, and figures about it."""
    rnd = random.Random(seed)
    order_keys = [f"order-{i:04d}" for i in range(ORDERS)]
    cust_keys = [f"cust-{i:03d}" for i in range(CUSTOMERS)]
    ghosts = [f"ghost-{i:02d}" for i in range(GHOSTS)]          # never produced
    customers: dict[str, dict] = {}
    out, kinds = [], Counter()
    for i in range(n):
        if rnd.random() < LEFT_SHARE:
            k = rnd.choice(order_keys[:HOT_ORDERS] if rnd.random() < 0.5 else order_keys)
            r = rnd.random()
            if r < 0.07:
                kinds["order delete"] += 1
                out.append((orders_topic, k.encode(), None))
                continue
            if r < 0.14:
                fk, kind = None, "order fk None"
            elif r < 0.24:
                fk, kind = rnd.choice(ghosts), "order to missing customer"
            else:
                fk, kind = rnd.choice(cust_keys), "order to customer"
            kinds[kind] += 1
            out.append((orders_topic, k.encode(), _js({"customer": fk, "n": i})))
        else:
            k = rnd.choice(cust_keys)
            cur = customers.get(k)
            r = rnd.random()
            if r < 0.12:
                kinds["customer delete"] += 1
                customers.pop(k, None)
                out.append((customers_topic, k.encode(), None))
                continue
            if cur is not None and r < 0.16:
                kinds["customer re-sent unchanged"] += 1
                new = cur
            elif cur is not None and r < 0.45:
                kinds["customer visits only"] += 1
                new = dict(cur, visits=cur["visits"] + 1)
            else:
                kinds["customer name/tier"] += 1
                new = {"name": f"{k}-v{i}", "tier": rnd.choice(("gold", "silver", "bronze")),
                       "visits": 0 if cur is None else cur["visits"]}
            customers[k] = new
            out.append((customers_topic, k.encode(), _js(new)))
    return out, kinds


def python_join(left: dict[bytes, bytes], right: dict[bytes, bytes], how: str) -> dict[bytes, dict]:
    """The from-scratch foreign-key join of two final tables."""
    out = {}
    for pk, lv in left.items():
        order = json.loads(lv)
        fk = order["customer"]
        customer = None if fk is None or fk.encode() not in right else json.loads(right[fk.encode()])
        if customer is None and how == "inner":
            continue
        out[pk] = apps.join_order_customer(order, customer)
    return out


def sequences(records) -> dict[bytes, list]:
    """{key: [value bytes | None, ...]} in output order."""
    out = defaultdict(list)
    for k, v in records:
        out[k].append(v)
    return dict(out)


def final_of(seqs: dict[bytes, list]) -> dict[bytes, bytes]:
    return {k: seq[-1] for k, seq in seqs.items() if seq[-1] is not None}


def join_counters(metrics: dict, topology, join: str) -> dict[str, int]:
    """The foreign-key counters of one join, summed over its four operators (found by store)."""
    stores = {join, f"{join}-subscription-store"}
    total = Counter()
    for node in topology.nodes:
        if node.name.startswith("KTABLE-FK-JOIN-") and stores & set(node.stores):
            role = node.name.removeprefix("KTABLE-FK-JOIN-").rsplit("-", 1)[0].lower()  # e.g. resolve
            for k, v in metrics.get(node.name, {}).items():
                total[f"{role}.{k}" if k == "unchanged_skipped" else k] += v
    return dict(total)


def run_workers_while_producing(kafka_bootstrap, topology, app, state_dir, records, n_workers,
                                topics: dict[str, int]):
    """Start ``n_workers`` workers of ``app`` in threads (one state directory, as the stream
    threads of one instance), wait until they own every task, produce ``records`` while they
    run (chunks of 300 records every 50 ms, so customer updates meet subscriptions and results
    that already exist), wait until the group has processed and committed everything (input and
    internal topics), stop them. Returns (workers, delivery ends, seconds producing, seconds
    from the first record produced to drained, seconds from the workers' start to every task
    owned).

    The wait for every task owned covers each worker's start-up too: on Apache Kafka that is
    creating the application's internal topics (each create returns once the broker's metadata
    lists them: 2-4 s here on a quiet machine, several times that on a loaded one) and the
    partitioner checks, then the group's rounds (the first worker alone, the second joining,
    the follow-up round of the cooperative move: about 1-2 s)."""
    workers = [Worker(topology(), kafka_bootstrap, app, state_dir, commit_interval_ms=500,
                      consumer_config=TEST_CONSUMER_CONFIG) for _ in range(n_workers)]
    failures = []

    def run(w):
        try:
            w.run(install_signal_handlers=False)
        except BaseException as exc:  # re-raised in the test thread
            failures.append(exc)

    def check():   # a worker that stopped on an error: its error, not a drain that never comes
        if failures:
            raise failures[0]

    threads = [threading.Thread(target=run, args=(w,), name=f"fk-worker-{i}") for i, w in enumerate(workers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    try:
        deadline = started + 120
        while not (all(w.tasks for w in workers) and sum(len(w.tasks) for w in workers) == 2 * PARTS):
            assert not failures and time.monotonic() < deadline, "the workers own not every task after 120 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        owned_s = t0 - started
        ends = produce_interleaved(kafka_bootstrap, records, chunk=300, pause_s=0.05)
        produced_s = time.monotonic() - t0
        wait_until_group_drained(kafka_bootstrap, app, topics, check=check)
        elapsed = time.monotonic() - t0
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    if failures:
        raise failures[0]
    return workers, ends, produced_s, elapsed, owned_s


def check_fk_joins(kafka_bootstrap, unique, tmp_path, report, n_workers: int, with_driver: bool):
    orders, customers = f"orders-{unique}", f"customers-{unique}"
    outs = {"fk-inner": f"fk-inner-out-{unique}", "fk-left": f"fk-left-out-{unique}"}
    app = f"fkapp-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, **{t: PARTS for t in outs.values()}})

    def topology():
        return apps.fk_joins_topology(orders, customers, outs["fk-inner"], outs["fk-left"])

    records, kinds = fk_scenario(orders, customers)
    n_left = sum(t == orders for t, _, _ in records)
    # interleaved in time: the longest run of one topic is short, both topics span the whole run
    runs, longest, prev = 0, 0, None
    for t, _, _ in records:
        runs = runs + 1 if t == prev else 1
        longest, prev = max(longest, runs), t
    assert longest < 40 and 0.55 < n_left / N < 0.65

    internal_topics = {j: {side: f"{app}-{j}-subscription-{side}-topic" for side in ("registration", "response")}
                       for j in apps.FK_JOINS}
    workers, ends, produced_s, elapsed, owned_s = run_workers_while_producing(
        kafka_bootstrap, topology, app, tmp_path, records, n_workers,
        {t: PARTS for t in [orders, customers] + [t for d in internal_topics.values() for t in d.values()]})
    assert {t: sum(e.values()) for t, e in ends.items()} == {orders: n_left, customers: N - n_left}

    left_msgs = kafka.read_topic(kafka_bootstrap, orders)
    right_msgs = kafka.read_topic(kafka_bootstrap, customers)
    assert len(left_msgs) + len(right_msgs) == N
    # Kafka's murmur2 here is the producer's partitioner: every record is where it says.
    misplaced = [(m.topic(), m.key(), m.partition()) for m in left_msgs + right_msgs
                 if m.partition() != key_partition(m.key(), PARTS)]
    assert misplaced == []
    with_fk = [(m.key(), json.loads(m.value())["customer"]) for m in left_msgs if m.value() is not None]
    with_fk = [(pk, fk) for pk, fk in with_fk if fk is not None]
    apart = sum(key_partition(pk, PARTS) != key_partition(fk.encode(), PARTS) for pk, fk in with_fk)
    assert apart / len(with_fk) > 0.6
    moves = Counter(m.key() for m in left_msgs)
    report(f"input: {N} records ({n_left} orders, {N - n_left} customers), {PARTS}+{PARTS} partitions, "
           f"longest same-topic run {longest}, produced in {produced_s:.1f} s while {n_workers} worker(s) ran; "
           f"{dict(kinds)}")
    report(f"orders whose customer is on another partition: {apart}/{len(with_fk)} "
           f"({100 * apart / len(with_fk):.0f} %); most-updated order {moves.most_common(1)[0][1]} times")

    internal = {j: {side: kafka.read_topic(kafka_bootstrap, t) for side, t in d.items()}
                for j, d in internal_topics.items()}
    n_internal = sum(len(v) for d in internal.values() for v in d.values())
    processed = [w.records_processed for w in workers]
    # every input and every internal record processed once: nothing left behind, nothing twice
    # (and with two workers, both did part of it)
    assert sum(processed) == N + n_internal and min(processed) > 0

    want_tables = {"fk-inner": python_join(final_table(left_msgs), final_table(right_msgs), "inner"),
                   "fk-left": python_join(final_table(left_msgs), final_table(right_msgs), "left")}
    assert len(want_tables["fk-inner"]) > 300 and len(want_tables["fk-left"]) > len(want_tables["fk-inner"]) + 100

    driver_seqs = None
    if with_driver:  # the driver, fed the input as read back (topic by topic, partition then offset)
        t0 = time.monotonic()
        d = TopologyTestDriver(topology())
        with d:
            pipe_messages(d, left_msgs + right_msgs)
        raw = Serdes.bytes()
        driver_seqs = {j: sequences((r.key, r.value) for r in d.read_output(t, key_serde=raw, value_serde=raw))
                       for j, t in outs.items()}
        report(f"driver: {N} records in {time.monotonic() - t0:.1f} s")

    m = {}
    for w in workers:
        for node, counters in w.metrics().items():
            agg = m.setdefault(node, Counter())
            agg.update(counters)
    topo = workers[0].topology
    for j, topic in outs.items():
        out_msgs = kafka.read_topic(kafka_bootstrap, topic)
        assert [msg for msg in out_msgs if msg.partition() != key_partition(msg.key(), PARTS)] == []
        seqs = sequences((msg.key(), msg.value()) for msg in out_msgs)
        got = final_of(seqs)
        # 1. the from-scratch join of the final input tables
        assert {k: json.loads(v) for k, v in got.items()} == want_tables[j], j
        # 2. the invariant, per key in output order
        bad = {k: v for k, seq in seqs.items() if (v := table_emission_violations(seq))}
        assert bad == {}, (j, dict(list(bad.items())[:5]))
        # 3. the driver's final table, byte for byte (and its output keeps the invariant too)
        if driver_seqs is not None:
            assert got == final_of(driver_seqs[j]), j
            bad = {k: v for k, seq in driver_seqs[j].items() if (v := table_emission_violations(seq))}
            assert bad == {}, (j, "driver", dict(list(bad.items())[:5]))

        c = join_counters(m, topo, j)
        n_subs, n_resps = len(internal[j]["registration"]), len(internal[j]["response"])
        tombstones = sum(msg.value() is None for msg in out_msgs)
        sink = next(n.name for n in topo.nodes if n.sink_topic == topic)
        assert m[sink]["records_out"] == len(out_msgs)
        # the records the workers held until a commit and replaced by a later one of the same
        # pair (processor/engine/fk_join_coalescing.py) never reached the topics
        coalesced = {side: m[next(n.name for n in topo.nodes if n.sink_topic == t)].get("records_coalesced", 0)
                     for side, t in internal_topics[j].items()}
        assert c["subscriptions_sent"] + c["unsubscriptions_sent"] - coalesced["registration"] == n_subs
        assert c["responses_sent"] - coalesced["response"] == n_resps
        assert c["stale_responses_dropped"] > 0           # orders moved on before their answers came
        assert c["resolve.unchanged_skipped"] > 0         # e.g. "visits"-only customer updates
        assert tombstones > 0
        driver_n = "" if driver_seqs is None else f"driver {sum(map(len, driver_seqs[j].values()))} output records; "
        report(f"{j}: {len(out_msgs)} output records ({tombstones} tombstones) for {len(got)} final rows; "
               f"{driver_n}{n_subs} subscription and {n_resps} response records ({coalesced['registration']} "
               f"and {coalesced['response']} replaced by a later one before a commit)")
        report(f"{j}: counters {dict(sorted(c.items()))}")

    # The stores after the run hold exactly the final left table's subscriptions: one per order
    # with a customer, at that customer, with the order's current version (the provenance of
    # its latest change's subscription) and partition, and
    # nothing else (every move unsubscribed from the old customer).
    for j in apps.FK_JOINS:
        versions, subscribed = {}, {}
        for p in range(PARTS):
            db = RocksDBDatabase(tmp_path / app / f"task-0_{p}")
            try:
                versions.update({pk: wire.decode_left_version(v) for pk, v in db.store(f"{j}-version-store").items()})
            finally:
                db.close()
            db = RocksDBDatabase(tmp_path / app / f"task-1_{p}")
            try:
                for ck, v in db.store(f"{j}-subscription-store").items():
                    fk, pk = combined_key.decode(ck)
                    assert key_partition(fk, PARTS) == p
                    sub = wire.decode_subscriber(v)
                    subscribed[(fk, pk)] = (sub.primary_partition, sub.echo)
            finally:
                db.close()
        final_left = {pk: json.loads(v)["customer"] for pk, v in final_table(left_msgs).items()}
        assert sorted(versions) == sorted(final_left), j
        want = {(fk.encode(), pk): (key_partition(pk, PARTS), versions[pk]) for pk, fk in final_left.items()
                if fk is not None}
        assert subscribed == want, j
    report(f"subscription stores after the run: {len(subscribed)} entries per join, one per order with a customer")

    task = m.get("task", {})
    report(f"{n_workers} worker(s): {processed} records processed ({N} input + {n_internal} internal) "
           f"in {elapsed:.1f} s from the first record produced to the group drained "
           f"({sum(processed) / elapsed:,.0f} rec/s); every task owned {owned_s:.1f} s after the workers started; "
           f"task counters {dict(task)}")


def test_fk_joins_on_broker_equal_python_and_driver(kafka_bootstrap, unique, tmp_path, report):
    check_fk_joins(kafka_bootstrap, unique, tmp_path, report, n_workers=1, with_driver=True)


def test_fk_joins_two_workers_in_threads(kafka_bootstrap, unique, tmp_path, report):
    """The same with two workers sharing the tasks (and one state directory): subscriptions and
    responses cross from one worker to the other."""
    check_fk_joins(kafka_bootstrap, unique, tmp_path, report, n_workers=2, with_driver=False)
