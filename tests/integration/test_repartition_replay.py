"""A replayed batch on a repartition topic (produced twice on purpose) leaves every aggregate exact.

Records on a repartition topic carry the ``processor.source`` header (source topic, partition,
offset, sequence); the receiving task keeps a high-water mark per (its input topic, source topic,
source partition) and drops every record at or below it (``processor/provenance.py``). Here a
batch of repartition records, read back from the broker with their keys, values, timestamps and
headers, is produced AGAIN to the same partitions by a plain producer, as a broker or an upstream
retry could do:

1. after the worker drained the input (a stream aggregation: sums per region), and
2. while the worker processes new input (a table aggregation with a subtractor: totals per
   customer, next to a foreign-key join), so the copies sit between new records in the
   repartition partitions; one batch from before the run, one from records the running worker
   had just written.

Asserted: ``metrics()["task"]["duplicates_dropped"]`` equals exactly the number of re-produced
records; every aggregate store (value bytes and timestamps, last-emitted column included) equals
the broker-free driver's and a plain-Python computation over the input; the aggregate's output
topic holds, per key, exactly the sequence a plain-Python fold over the repartition topic gives
when it applies the header contract (the copies change nothing, emit nothing); the high-water
marks in each receiving task's store are exactly the highest (offset, sequence) per source
partition of the records it received.
"""

import json
import threading
import time
from collections import defaultdict

from confluent_kafka import Producer

from processor import provenance
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.serde import change as change_codec
from processor.state.store import BOOKKEEPING_STORE
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    driver_outputs_by_key,
    driver_store_bytes,
    final_table,
    final_table_values,
    latest_task_dirs,
    order_totals,
    produce,
    produce_interleaved,
    reliability_scenario,
    skewed_events,
    task_store_bytes,
    wait_for,
    wait_until_group_drained,
)

PARTS = 4


# -- helpers ------------------------------------------------------------------------------------

def reproduce(bootstrap: str, messages) -> None:
    """Produce ``messages`` again, each to its own topic and partition, with its key, value,
    timestamp and headers."""
    errors = []
    p = Producer(kafka.producer_defaults(bootstrap))
    for m in messages:
        p.produce(m.topic(), m.value(), m.key(), partition=m.partition(), timestamp=m.timestamp()[1],
                  headers=m.headers(), on_delivery=lambda err, msg: err is not None and errors.append(err))
    assert p.flush(30) == 0
    assert not errors, errors


def pick_batch(messages, per_partition: int, where: float):
    """Up to ``per_partition`` consecutive records of each partition, starting at ``where`` (a
    fraction) of that partition's records."""
    parts = defaultdict(list)
    for m in messages:
        parts[m.partition()].append(m)
    batch = []
    for p in sorted(parts):
        ms = parts[p]
        start = min(int(len(ms) * where), max(len(ms) - per_partition, 0))
        batch.extend(ms[start:start + per_partition])
    return batch


def content(m):
    return m.partition(), m.key(), m.value(), m.timestamp()[1], tuple(m.headers() or ())


def apply_contract(messages):
    """The header contract in plain Python over a repartition topic (partition by partition, in
    offset order): ``(kept, dropped, marks)``, marks = {(partition, source topic, source
    partition): (offset, sequence)}."""
    kept, dropped, marks = [], [], {}
    for m in messages:
        raw = provenance.find(m.headers())
        assert raw is not None, content(m)
        src = provenance.decode(raw)
        mk = (m.partition(), src.topic, src.partition)
        pos = (src.offset, src.sequence)
        if mk in marks and pos <= marks[mk]:
            dropped.append(m)
        else:
            marks[mk] = pos
            kept.append(m)
    return kept, dropped, marks


def task_marks(task_dirs: dict, sub: int, input_topic: str) -> dict:
    """The high-water marks of ``input_topic`` in the task stores of sub-topology ``sub``:
    {(partition, source topic, source partition): (offset, sequence)}."""
    out = {}
    for name, d in task_dirs.items():
        s, p = name[len("task-"):].split("_")
        if int(s) != sub:
            continue
        prefix = f"hwm\x00{input_topic}\x00".encode()
        for k, v in task_store_bytes([d], [BOOKKEEPING_STORE])[BOOKKEEPING_STORE].items():
            if k.startswith(prefix):
                _, _, src_topic, src_part = k.decode().split("\x00")
                assert k == provenance.mark_key(input_topic, src_topic, int(src_part))
                out[(int(p), src_topic, int(src_part))] = provenance.decode_mark(v)
    return out


def by_key_values(messages) -> dict[bytes, list]:
    """{key: [(json value, timestamp), ...]} in topic order."""
    out = defaultdict(list)
    for m in messages:
        out[m.key()].append((None if m.value() is None else json.loads(m.value()), m.timestamp()[1]))
    return dict(out)


def run_in_thread(worker):
    errors = []

    def target():
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, errors


# -- 1. stream aggregation, the copies produced after the worker drained -----------------------

AGG_STORES = ("level-on-change", "level-on-change.emitted", "sum-by-region", "sum-by-region.emitted")


def region_sum_emissions(kept) -> dict[bytes, list]:
    """What ``sum-by-region`` (Emit.on_change) forwards for the records it applies, in order:
    per region [(sum, timestamp of its last real change)]; an amount of 0 changes nothing."""
    agg, out = {}, defaultdict(list)
    for m in kept:
        amount, ts = json.loads(m.value())["amount"], m.timestamp()[1]
        cur = agg.get(m.key())
        if cur is None:
            new = (amount, ts)
        elif amount:
            new = (cur[0] + amount, max(ts, cur[1]))
        else:
            continue
        agg[m.key()] = new
        out[m.key()].append(new)
    return dict(out)


def test_repartition_batch_produced_twice_after_drain(kafka_bootstrap, unique, tmp_path, monkeypatch, report):
    n = 6_000
    inp, prefix, app = f"events-{unique}", f"replay-{unique}", f"replay-{unique}"
    level, by_region = f"{prefix}-level", f"{prefix}-sum-by-region"
    repartition = f"{app}-sum-by-region-repartition"
    for k, v in {"APP_INPUT": inp, "APP_OUTPUT_PREFIX": prefix}.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, level: PARTS, by_region: PARTS})
    records = skewed_events(n, keys=500, seed=3)
    assert sum(produce(kafka_bootstrap, inp, records).values()) == n
    state = tmp_path / "state"

    def worker():
        return Worker(apps.crash_aggregates_topology(), kafka_bootstrap, app, state, commit_interval_ms=500,
                      consumer_config=TEST_CONSUMER_CONFIG)

    t0 = time.monotonic()
    w1 = worker()
    w1.run(until_drained=True, install_signal_handlers=False)
    first_s = time.monotonic() - t0
    assert w1.metrics()["task"]["duplicates_dropped"] == 0
    assert w1.records_processed == 2 * n   # every event once from the input, once from the repartition topic

    rep_before = kafka.read_topic(kafka_bootstrap, repartition)
    assert len(rep_before) == n
    out_before = {t: [content(m) for m in kafka.read_topic(kafka_bootstrap, t)] for t in (level, by_region)}
    batch = pick_batch(rep_before, per_partition=150, where=0.3)
    batch_parts = sorted({m.partition() for m in batch})
    assert len(batch) >= 300 and len(batch_parts) >= 2, (len(batch), batch_parts)
    reproduce(kafka_bootstrap, batch)

    t0 = time.monotonic()
    w2 = worker()
    w2.run(until_drained=True, install_signal_handlers=False)
    second_s = time.monotonic() - t0
    dropped = w2.metrics()["task"]["duplicates_dropped"]
    assert dropped == len(batch)
    assert w2.records_processed == len(batch)

    # the repartition topic now holds every record of the batch twice; the contract drops exactly those
    rep_after = kafka.read_topic(kafka_bootstrap, repartition)
    assert sorted(map(content, rep_after)) == sorted(map(content, rep_before + batch))
    kept, model_dropped, model_marks = apply_contract(rep_after)
    assert [content(m) for m in model_dropped] == [content(m) for m in sorted(batch, key=lambda m: m.partition())]
    assert [content(m) for m in kept] == [content(m) for m in rep_before]

    # outputs: the copies emitted nothing; per key exactly the sequence of a plain-Python fold
    out_after = {t: [content(m) for m in kafka.read_topic(kafka_bootstrap, t)] for t in (level, by_region)}
    assert out_after == out_before
    got_region = by_key_values(kafka.read_topic(kafka_bootstrap, by_region))
    assert got_region == region_sum_emissions(kept)
    assert got_region != region_sum_emissions(rep_after)   # applying the copies would show
    input_messages = kafka.read_topic(kafka_bootstrap, inp)
    want_level = driver_outputs_by_key(apps.crash_aggregates_topology, inp, [level], input_messages)[level]
    got_level = defaultdict(list)
    for m in kafka.read_topic(kafka_bootstrap, level):
        got_level[m.key()].append((m.value(), m.timestamp()[1]))
    assert dict(got_level) == want_level

    # stores: byte for byte the driver's; the sums per region are the plain-Python sums
    task_dirs = latest_task_dirs([state / app])
    assert len(task_dirs) == 2 * PARTS
    live = task_store_bytes(task_dirs.values(), AGG_STORES)
    with TopologyTestDriver(apps.crash_aggregates_topology()) as driver:
        for m in input_messages:
            driver.pipe_raw(inp, m.key(), m.value(), m.timestamp()[1])
        want = driver_store_bytes(driver, AGG_STORES)
    for s in AGG_STORES:
        assert live[s] == want[s], (s, len(live[s]), len(want[s]))
    sums = defaultdict(int)
    for _, v in records:
        d = json.loads(v)
        sums[d["region"]] += d["amount"]
    assert {k.decode(): json.loads(v[8:]) for k, v in live["sum-by-region"].items()} == dict(sums)

    # the high-water marks: per receiving task and source partition, the last record it received
    marks = task_marks(task_dirs, 1, repartition)
    assert marks == model_marks
    assert {src for (_, src, _) in marks} == {inp}
    report(f"{n} events on {PARTS} partitions -> {len(rep_before)} repartition records; first run "
           f"{first_s:.1f} s; {len(batch)} of them produced again (partitions {batch_parts}); second run "
           f"{second_s:.1f} s processed {w2.records_processed}, dropped {dropped}; outputs unchanged; "
           f"{len(marks)} high-water marks equal the model's")


# -- 2. table aggregation with a subtractor, copies interleaved with new records -------------------

TABLES = ("orders-store", "customers-store", "enriched", "totals", "totals.emitted")


def totals_emissions(kept) -> dict[bytes, list]:
    """What ``totals`` (initializer, adder, subtractor; Emit.on_change) forwards for the changes
    it applies, in order: per customer [({"sum", "orders"}, timestamp of its last real change)].
    The subtractor runs only when the customer has an aggregate."""
    agg, out = {}, defaultdict(list)
    for m in kept:
        new_b, old_b = change_codec.decode(m.value())
        ts = m.timestamp()[1]
        cur = agg.get(m.key())
        a = None if cur is None else cur[0]
        if old_b is not None and a is not None:
            a = {"sum": a["sum"] - json.loads(old_b)["amount"], "orders": a["orders"] - 1}
        if new_b is not None:
            a = a if a is not None else {"sum": 0, "orders": 0}
            a = {"sum": a["sum"] + json.loads(new_b)["amount"], "orders": a["orders"] + 1}
        if a is None or (cur is not None and a == cur[0]):
            continue
        new = (a, ts if cur is None else max(ts, cur[1]))
        agg[m.key()] = new
        out[m.key()].append(new)
    return dict(out)


def test_repartition_batches_produced_twice_while_processing(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                              report):
    n = 10_000
    orders, customers, prefix, app = f"orders-{unique}", f"customers-{unique}", f"rr-{unique}", f"rr-{unique}"
    outs = {"enriched": f"{prefix}-enriched", "totals": f"{prefix}-totals"}
    repartition = f"{app}-totals-repartition"
    internal = [repartition, f"{app}-enriched-subscription-registration-topic",
                f"{app}-enriched-subscription-response-topic"]
    for k, v in {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": prefix}.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, **{t: PARTS for t in outs.values()}})
    records = reliability_scenario(orders, customers, n, seed=9)
    half = n // 2
    state = tmp_path / "state"

    def worker():
        return Worker(apps.reliability_topology(), kafka_bootstrap, app, state, commit_interval_ms=300,
                      consumer_config=TEST_CONSUMER_CONFIG)

    # the first half, processed to the end
    produce_interleaved(kafka_bootstrap, records[:half])
    w1 = worker()
    w1.run(until_drained=True, install_signal_handlers=False)
    assert w1.metrics()["task"]["duplicates_dropped"] == 0
    rep_first = kafka.read_topic(kafka_bootstrap, repartition)
    old_batch = pick_batch(rep_first, per_partition=100, where=0.5)
    first_ends = defaultdict(int)
    for m in rep_first:
        first_ends[m.partition()] = m.offset() + 1

    # the second half, while a worker runs; copies of old records, then of records just written
    w2 = worker()
    thread, errors = run_in_thread(w2)
    t0 = time.monotonic()
    try:
        wait_for(lambda: len(w2.tasks) == 3 * PARTS or errors, 60, "the worker's assignment")
        assert not errors, errors
        quarter = half // 4
        second = records[half:]
        produce_interleaved(kafka_bootstrap, second[:quarter], timestamp0=1_000_000 + half, chunk=250, pause_s=0.05)
        # (the join's sub-topology sends its repartition records at its commits: wait for some of
        # this run's before the copies, so new records come before them)
        wait_for(lambda: any(m.offset() >= first_ends[m.partition()]
                             for m in kafka.read_topic(kafka_bootstrap, repartition)) or errors,
                 30, "the second run's first repartition records")
        reproduce(kafka_bootstrap, old_batch)
        produce_interleaved(kafka_bootstrap, second[quarter:2 * quarter], timestamp0=1_000_000 + half + quarter,
                            chunk=250, pause_s=0.05)
        recent = [m for m in kafka.read_topic(kafka_bootstrap, repartition) if m.offset() >= first_ends[m.partition()]]
        new_batch = pick_batch(recent, per_partition=100, where=1.0)   # the last ones written
        assert len(new_batch) >= 200, len(new_batch)
        reproduce(kafka_bootstrap, new_batch)
        produce_interleaved(kafka_bootstrap, second[2 * quarter:], timestamp0=1_000_000 + half + 2 * quarter,
                            chunk=250, pause_s=0.05)
        produce_s = time.monotonic() - t0
        wait_until_group_drained(kafka_bootstrap, app, {t: PARTS for t in [orders, customers] + internal},
                                 timeout_s=120)
        drained_s = time.monotonic() - t0
        assert not errors, errors
    finally:
        w2.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert not errors, errors
    copies = len(old_batch) + len(new_batch)
    dropped = w2.metrics()["task"]["duplicates_dropped"]
    assert dropped == copies

    # the repartition topic: both batches twice, the copies between new records
    rep = kafka.read_topic(kafka_bootstrap, repartition)
    kept, model_dropped, model_marks = apply_contract(rep)
    assert sorted(map(content, model_dropped)) == sorted(map(content, old_batch + new_batch))
    assert len(kept) + copies == len(rep)
    copy_at = {(m.partition(), m.offset()) for m in model_dropped}
    interleaved = 0
    for p in sorted({m.partition() for m in model_dropped}):
        # what arrived on partition p during the second run: n = a new record, c = a copy
        kinds = "".join("c" if (p, m.offset()) in copy_at else "n"
                        for m in rep if m.partition() == p and m.offset() >= first_ends[p])
        assert kinds.count("c") == sum(m.partition() == p for m in old_batch + new_batch)
        assert kinds.endswith("n"), (p, kinds[-20:])   # new records after the last copies
        interleaved += kinds.startswith("n")           # and new records before the first ones
    assert interleaved >= 1

    # outputs: totals per key exactly the plain-Python fold of the kept changes; final tables = driver
    left_msgs, right_msgs = kafka.read_topic(kafka_bootstrap, orders), kafka.read_topic(kafka_bootstrap, customers)
    assert len(left_msgs) + len(right_msgs) == n
    got_totals = by_key_values(kafka.read_topic(kafka_bootstrap, outs["totals"]))
    assert got_totals == totals_emissions(kept)
    assert got_totals != totals_emissions(rep)   # applying the copies would show
    with TopologyTestDriver(apps.reliability_topology()) as driver:
        for m in left_msgs + right_msgs:
            driver.pipe_raw(m.topic(), m.key(), m.value(), m.timestamp()[1])
        want = driver_store_bytes(driver, TABLES)
        want_out = {j: final_table_values(driver.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()))
                    for j, t in outs.items()}
    for j, t in outs.items():
        assert final_table(kafka.read_topic(kafka_bootstrap, t)) == want_out[j], j

    # stores: the driver's, byte for byte (the join result: its value; its timestamp depends on
    # how partitions interleave); totals = plain-Python totals over the final orders table
    task_dirs = latest_task_dirs([state / app])
    assert len(task_dirs) == 3 * PARTS
    live = task_store_bytes(task_dirs.values(), TABLES)
    for s in TABLES:
        if s == "enriched":
            assert {k: v[8:] for k, v in live[s].items()} == {k: v[8:] for k, v in want[s].items()}, s
        else:
            assert live[s] == want[s], (s, len(live[s]), len(want[s]))
    python_totals = order_totals(left_msgs)
    totals = {k.decode(): json.loads(v[8:]) for k, v in live["totals"].items()}
    assert {k: t for k, t in totals.items() if t["orders"]} == python_totals

    marks = task_marks(task_dirs, 2, repartition)
    assert marks == model_marks
    assert {src for (_, src, _) in marks} == {orders}
    report(f"{n} interleaved records ({half} before, {n - half} while the worker ran, produced in "
           f"{produce_s:.1f} s, drained after {drained_s:.1f} s); {len(rep)} records on {repartition}; "
           f"copies: {len(old_batch)} of old records + {len(new_batch)} of just-written ones "
           f"(partitions {sorted({m.partition() for m in model_dropped})}, between new records in "
           f"{interleaved}); dropped {dropped}; totals output = fold ({sum(map(len, got_totals.values()))} "
           f"records), stores = driver, {len(marks)} high-water marks = model")
