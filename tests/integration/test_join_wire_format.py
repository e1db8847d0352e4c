"""Join wire formats and stores on a real broker.

1. The foreign-key join's internal topics, read RAW after a small scripted run (orders on 3
   partitions, customers on 5, so a partition count mixed up between the two sides shows): the
   subscription and response values (``processor/serde/subscription.py``), the instruction each
   scripted change must produce, the partitions every record sits on, and the provenance
   headers that tie a response to the subscription it answers and a subscription to the left
   record that caused it (``processor/provenance.py``).
2. The self-join rewrite (KIP-862): a table joined with itself keeps one RocksDB column family
   fewer per task than the unoptimized topology, and both write the same output.
"""

import json
import threading
import time
from collections import defaultdict

from processor import provenance
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.serde import subscription as wire
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    by_key,
    driver_output_by_key,
    final_table,
    key_partition,
    produce,
    produce_interleaved,
    table_updates,
    wait_until_group_drained,
)

LEFT_PARTS, RIGHT_PARTS = 3, 5
UNSUB, SUB, SUB_IF = wire.UNSUBSCRIBE, wire.SUBSCRIBE_AND_RESPOND, wire.SUBSCRIBE_RESPOND_IF_PRESENT

# Keys chosen so that the records spread over partitions (checked below): orders on 0, 1 and
# 2 of 3; customers C1, C2 and the never-produced C3 on 1, 2 and 3 of 5.
O1, O2, O3, O5, O6, O7 = (f"order-{i}" for i in (1, 2, 3, 5, 6, 7))
C1, C2, C3 = "cust-a", "cust-b", "cust-d"


def _js(v) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


def phases(orders, customers):
    """Four phases, each processed to the end before the next is produced, so every instruction
    and every response below is determined."""
    def o(k, fk, n):
        return (orders, k.encode(), _js({"customer": fk, "n": n}))

    def c(k, name, tier):
        return (customers, k.encode(), _js({"name": name, "tier": tier, "visits": 0}))

    return [
        # P0: two customers (C3 never exists)
        [c(C1, "Ada", "gold"), c(C2, "Bob", "silver")],
        # P1: first rows: to C1, to the missing C3, without a customer, ...
        [o(O1, C1, 1), o(O2, C3, 1), o(O3, None, 1), o(O5, C1, 1), o(O6, C2, 1), o(O7, C1, 1)],
        # P2: O1 C1->C2 (had an inner result), O2 C3->C1 (had none), O3 None->C2, O5 deleted,
        #     O6 C2->None, O7 changes with the same customer
        [o(O1, C2, 2), o(O2, C1, 2), o(O3, C2, 2), (orders, O5.encode(), None), o(O6, None, 2), o(O7, C1, 2)],
        # P3: C1 changes (subscribers O2, O7), C2 is deleted (subscribers O1, O3)
        [c(C1, "Ada", "platinum"), (customers, C2.encode(), None)],
    ]


# Per join, per order: the subscription records its changes must produce, in order:
# (instruction, foreign key). "inner" subscribes with 0x02 while the order has no result.
EXPECTED_SUBSCRIPTIONS = {
    "fk-inner": {O1: [(SUB_IF, C1), (UNSUB, C1), (SUB, C2)],
                 O2: [(SUB_IF, C3), (UNSUB, C3), (SUB_IF, C1)],
                 O3: [(SUB_IF, C2)],
                 O5: [(SUB_IF, C1), (UNSUB, C1)],
                 O6: [(SUB_IF, C2), (UNSUB, C2)],
                 O7: [(SUB_IF, C1), (SUB, C1)]},
    "fk-left": {O1: [(SUB, C1), (UNSUB, C1), (SUB, C2)],
                O2: [(SUB, C3), (UNSUB, C3), (SUB, C1)],
                O3: [(SUB, C2)],
                O5: [(SUB, C1), (UNSUB, C1)],
                O6: [(SUB, C2), (UNSUB, C2)],
                O7: [(SUB, C1), (SUB, C1)]},
}

# Per join: the responses, as (order, caused by, foreign key, right row present), sorted.
# "subscription": answered by the subscription receiver; "customers": a customer change
# answered by the responder for every subscriber of that customer.
_P3 = [(O2, "customers", C1, True), (O7, "customers", C1, True),
       (O1, "customers", C2, False), (O3, "customers", C2, False)]
EXPECTED_RESPONSES = {
    "fk-inner": sorted([(O1, "subscription", C1, True), (O5, "subscription", C1, True),
                        (O6, "subscription", C2, True), (O7, "subscription", C1, True),
                        (O1, "subscription", C2, True), (O2, "subscription", C1, True),
                        (O3, "subscription", C2, True), (O7, "subscription", C1, True)] + _P3),
    "fk-left": sorted([(O1, "subscription", C1, True), (O2, "subscription", C3, False),
                       (O5, "subscription", C1, True), (O6, "subscription", C2, True),
                       (O7, "subscription", C1, True),
                       (O1, "subscription", C2, True), (O2, "subscription", C1, True),
                       (O3, "subscription", C2, True), (O7, "subscription", C1, True)] + _P3),
}


def _header(msg, name):
    values = [v for k, v in (msg.headers() or []) if k == name]
    assert len(values) <= 1, (name, msg.headers())
    return values[0] if values else None


def test_fk_join_internal_topics_raw(kafka_bootstrap, unique, tmp_path, report):
    orders, customers = f"orders-{unique}", f"customers-{unique}"
    outs = {"fk-inner": f"wire-inner-{unique}", "fk-left": f"wire-left-{unique}"}
    app = f"wire-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: LEFT_PARTS, customers: RIGHT_PARTS,
                                          **{t: LEFT_PARTS for t in outs.values()}})
    assert sorted({key_partition(k.encode(), LEFT_PARTS) for k in (O1, O2, O3, O5, O6, O7)}) == [0, 1, 2]
    assert [key_partition(k.encode(), RIGHT_PARTS) for k in (C1, C2, C3)] == [1, 2, 3]
    sub_topics = {j: f"{app}-{j}-subscription-registration-topic" for j in apps.FK_JOINS}
    resp_topics = {j: f"{app}-{j}-subscription-response-topic" for j in apps.FK_JOINS}

    w = Worker(apps.fk_joins_topology(orders, customers, outs["fk-inner"], outs["fk-left"]), kafka_bootstrap,
               app, tmp_path, commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
    failure = []

    def run():
        try:
            w.run(install_signal_handlers=False)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="wire-worker")
    thread.start()
    all_topics = {orders: LEFT_PARTS, customers: RIGHT_PARTS, **{t: RIGHT_PARTS for t in sub_topics.values()},
                  **{t: LEFT_PARTS for t in resp_topics.values()}}
    try:
        deadline = time.monotonic() + 30
        while len(w.tasks) < LEFT_PARTS + RIGHT_PARTS and not failure:
            assert time.monotonic() < deadline, "the worker got no assignment within 30 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        for i, phase in enumerate(phases(orders, customers)):
            produce_interleaved(kafka_bootstrap, phase, timestamp0=1_000_000 + 1000 * i)
            wait_until_group_drained(kafka_bootstrap, app, all_topics, poll_s=0.2)
        elapsed = time.monotonic() - t0
    finally:
        w.stop()
        thread.join(60)
    assert not thread.is_alive()
    if failure:
        raise failure[0]

    # The created internal topics: subscriptions partitioned like the right table, responses
    # like the left table.
    parts = kafka.topic_partitions(kafka_bootstrap)
    assert {t: parts[t] for t in sub_topics.values()} == {t: RIGHT_PARTS for t in sub_topics.values()}
    assert {t: parts[t] for t in resp_topics.values()} == {t: LEFT_PARTS for t in resp_topics.values()}

    left_msgs = kafka.read_topic(kafka_bootstrap, orders)
    right_msgs = kafka.read_topic(kafka_bootstrap, customers)
    left_at = {(m.partition(), m.offset()): m for m in left_msgs}
    right_at = {(m.partition(), m.offset()): m for m in right_msgs}
    assert [m.partition() for m in left_msgs] == [key_partition(m.key(), LEFT_PARTS) for m in left_msgs]
    assert [m.partition() for m in right_msgs] == [key_partition(m.key(), RIGHT_PARTS) for m in right_msgs]
    right_partition_of = defaultdict(set)   # where the broker put each customer
    for m in right_msgs:
        right_partition_of[m.key()].add(m.partition())
    assert {k: len(v) for k, v in right_partition_of.items()} == {C1.encode(): 1, C2.encode(): 1}

    def customer_of(m):
        return None if m.value() is None else json.loads(m.value())["customer"]

    for j in apps.FK_JOINS:
        subs = kafka.read_topic(kafka_bootstrap, sub_topics[j])
        resps = kafka.read_topic(kafka_bootstrap, resp_topics[j])
        instructions = defaultdict(list)     # order -> [(source offset, sequence, instruction, fk)]
        by_source_header = {}                # processor.source bytes -> (subscription msg, decoded)
        last_sub = {}                        # order -> processor.source of its latest SUBSCRIBE
        for s in subs:
            v = s.value()
            assert v[0] == 0x01 and v[1] in (0x00, 0x01, 0x02), v[:2]
            sub = wire.decode_subscription(v)
            pk, fk = sub.pk.decode(), s.key().decode()
            # {0x01}{instruction}{4-byte BE primary partition}{pk bytes}, read by hand too
            assert (int.from_bytes(v[2:6], "big"), v[6:]) == (sub.primary_partition, sub.pk)
            assert s.partition() == key_partition(s.key(), RIGHT_PARTS), (j, pk, fk)
            assert s.partition() in right_partition_of.get(s.key(), {s.partition()}), (j, pk, fk)
            raw = _header(s, provenance.HEADER)
            assert raw is not None and raw not in by_source_header
            src = provenance.decode(raw)
            assert (src.topic, src.partition) == (orders, sub.primary_partition), (j, pk, src)
            assert sub.primary_partition == key_partition(sub.pk, LEFT_PARTS)
            cause = left_at[(src.partition, src.offset)]
            assert cause.key() == sub.pk, (j, pk, src)
            if sub.instruction == UNSUB:   # from the order's previous customer
                before = [m for m in left_msgs if m.partition() == src.partition and m.key() == sub.pk
                          and m.offset() < src.offset]
                assert before and customer_of(before[-1]) == fk != customer_of(cause), (j, pk, fk)
            else:
                assert customer_of(cause) == fk, (j, pk, fk)
            if sub.instruction != UNSUB and (src.offset, src.sequence) > last_sub.get(pk, ((-1, -1), b""))[0]:
                last_sub[pk] = ((src.offset, src.sequence), raw)
            assert _header(s, wire.ECHO_HEADER) is None
            assert s.timestamp()[1] == cause.timestamp()[1], (j, pk)
            instructions[pk].append((src.offset, src.sequence, sub.instruction, fk))
            by_source_header[raw] = (s, sub)
        got = {pk: [(ins, fk) for _, _, ins, fk in sorted(seq)] for pk, seq in instructions.items()}
        assert got == EXPECTED_SUBSCRIPTIONS[j], j
        # The left version store: per order with a customer, the processor.source of its latest
        # subscription (what a response must echo to be applied); per order without one, a
        # version no subscription carries; no entry for a deleted order.
        stored = {}
        for p in range(LEFT_PARTS):
            db = RocksDBDatabase(tmp_path / app / f"task-0_{p}")
            try:
                stored.update({pk.decode(): wire.decode_left_version(v)
                               for pk, v in db.store(f"{j}-version-store").items()})
            finally:
                db.close()
        assert sorted(stored) == [O1, O2, O3, O6, O7], j
        assert {pk: stored[pk] for pk in (O1, O2, O3, O7)} == {pk: last_sub[pk][1] for pk in (O1, O2, O3, O7)}, j
        assert stored[O6] not in by_source_header
        assert provenance.decode(stored[O6])[:2] == (orders, key_partition(O6.encode(), LEFT_PARTS))

        responses, by_cause = [], defaultdict(list)
        for r in resps:
            v = r.value()
            assert v[0] == 0x01, v[:1]
            resp = wire.decode_response(v)
            pk = r.key()
            # {0x01}{flags: bit 0 = row present}{4-byte BE fk length}{fk}{right value bytes}
            n = int.from_bytes(v[2:6], "big")
            assert v[1] == (resp.value is not None) and v[6:6 + n] == resp.fk, v
            echo, raw = _header(r, wire.ECHO_HEADER), _header(r, provenance.HEADER)
            assert echo is not None and raw is not None, (j, pk, r.headers())
            s, sub = by_source_header[echo]       # the subscription this response answers
            assert sub.pk == pk and sub.instruction != UNSUB, (j, pk)
            assert r.partition() == sub.primary_partition == key_partition(pk, LEFT_PARTS), (j, pk)
            assert resp.fk == s.key(), (j, pk)     # the foreign key it answers for
            src = provenance.decode(raw)
            if src.topic == sub_topics[j]:        # caused by that subscription itself
                assert (src.partition, src.offset) == (s.partition(), s.offset()), (j, pk, src)
                kind = "subscription"
                # max(left, right) timestamps: the customer row as it was when the phase ran
                rows = [m.timestamp()[1] for m in right_msgs
                        if m.key() == s.key() and m.timestamp()[1] < s.timestamp()[1]]
                assert r.timestamp()[1] == max([s.timestamp()[1]] + rows[-1:]), (j, pk)
            else:                                 # caused by a change of the subscribed customer
                assert src.topic == customers, (j, pk, src)
                change = right_at[(src.partition, src.offset)]
                assert change.key() == s.key() and resp.value == change.value(), (j, pk, src)
                by_cause[(src.partition, src.offset)].append((src.sequence, pk))
                assert r.timestamp()[1] == change.timestamp()[1], (j, pk)
                kind = "customers"
            if resp.value is not None:            # the customer's current row, as its bytes
                current = [m for m in right_msgs if m.key() == s.key() and m.value() is not None]
                assert resp.value in [m.value() for m in current], (j, pk)
            responses.append((pk.decode(), kind, s.key().decode(), resp.value is not None))
        assert sorted(responses) == EXPECTED_RESPONSES[j], j
        for cause, seq in by_cause.items():       # the responder answers in primary-key byte order
            assert [pk for _, pk in sorted(seq)] == sorted(pk for _, pk in seq), (j, cause)

        report(f"{j}: {len(subs)} subscription records on partitions "
               f"{sorted({s.partition() for s in subs})} of {RIGHT_PARTS}, instructions "
               f"{dict(sorted(_count(ins for seq in got.values() for ins, _ in seq).items()))}; "
               f"{len(resps)} responses on partitions {sorted({r.partition() for r in resps})} of {LEFT_PARTS} "
               f"({sum(k == 'customers' for _, k, _, _ in responses)} caused by customer changes)")

    # And the results themselves: per key exactly what the driver emits for the same phases
    # (value and timestamp; each phase changes a key at most once, so the per-key order is
    # determined), no internal header on the user topic, and the join of the final tables.
    d = TopologyTestDriver(apps.fk_joins_topology(orders, customers, outs["fk-inner"], outs["fk-left"]))
    with d:
        for i, phase in enumerate(phases(orders, customers)):
            for n, (topic, k, v) in enumerate(phase):
                d.pipe_raw(topic, k, v, 1_000_000 + 1000 * i + n)
    left, right = final_table(left_msgs), final_table(right_msgs)
    finals = {}
    for j, how in (("fk-inner", "inner"), ("fk-left", "left")):
        out_msgs = kafka.read_topic(kafka_bootstrap, outs[j])
        # (a table sink's records carry their origin, processor.origin, and nothing else of ours)
        assert [m.headers() for m in out_msgs if any(k.startswith("processor.") and k != provenance.ORIGIN_HEADER
                                                     for k, _ in m.headers() or [])] == []
        assert {provenance.decode_origin(dict(m.headers())[provenance.ORIGIN_HEADER]).application_id
                for m in out_msgs} == {app}
        want_seq = defaultdict(list)
        for r in d.read_output(outs[j], key_serde=Serdes.bytes(), value_serde=Serdes.bytes()):
            want_seq[r.key].append((r.value, r.timestamp))
        assert by_key(out_msgs) == dict(want_seq), j
        want = {}
        for pk, lv in left.items():
            order = json.loads(lv)
            fk = order["customer"]
            customer = json.loads(right[fk.encode()]) if fk is not None and fk.encode() in right else None
            if customer is not None or how == "left":
                want[pk] = apps.join_order_customer(order, customer)
        got = {k: json.loads(v) for k, v in final_table(out_msgs).items()}
        assert got == want, j
        finals[j] = sorted(k.decode() for k in got)
    assert finals == {"fk-inner": [O2, O7], "fk-left": [O1, O2, O3, O6, O7]}
    report(f"4 phases produced and drained in {elapsed:.1f} s; final rows {finals}")


def _count(items):
    out = defaultdict(int)
    for i in items:
        out[wire.INSTRUCTIONS[i]] += 1
    return out


def test_table_self_join_one_column_family_fewer(kafka_bootstrap, unique, tmp_path, report):
    inp = f"sj-in-{unique}"
    runs = {"optimized": (True, f"sj-opt-{unique}", f"sj-out-opt-{unique}"),
            "unoptimized": (False, f"sj-raw-{unique}", f"sj-out-raw-{unique}")}
    kafka.create_topics(kafka_bootstrap, {inp: 4, **{out: 4 for _, _, out in runs.values()}})
    records = table_updates(6_000, keys=800, seed=11)
    ends = produce(kafka_bootstrap, inp, records)
    assert sorted(ends) == [0, 1, 2, 3]

    outputs, families, stores = {}, {}, {}
    for label, (optimize, app, out) in runs.items():
        topology = apps.table_self_join_topology(inp, out, optimize=optimize)
        stores[label] = sorted(topology.stores)
        w = Worker(topology, kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
                   consumer_config=TEST_CONSUMER_CONFIG)
        t0 = time.monotonic()
        w.run(until_drained=True, install_signal_handlers=False)
        report(f"{label}: {w.records_processed} records in {time.monotonic() - t0:.1f} s; "
               f"passes {topology.applied_passes}")
        assert w.records_processed == len(records)
        msgs = kafka.read_topic(kafka_bootstrap, out)
        outputs[label] = [(m.partition(), m.key(), m.value(), m.timestamp()[1]) for m in msgs]
        families[label] = {}
        task_dirs = sorted((tmp_path / app).glob("task-*"))
        assert [d.name for d in task_dirs] == [f"task-0_{p}" for p in range(4)]
        for d in task_dirs:
            db = RocksDBDatabase(d)
            try:
                families[label][int(d.name.rsplit("_", 1)[1])] = sorted(db.column_families())
            finally:
                db.close()

    extra = [s for s in stores["unoptimized"] if s not in stores["optimized"]]
    assert len(extra) == 1 and set(stores["optimized"]) < set(stores["unoptimized"])
    for p in range(4):
        opt, raw = families["optimized"][p], families["unoptimized"][p]
        assert len(raw) == len(opt) + 1, (p, opt, raw)
        assert sorted(opt + extra) == raw, (p, opt, raw)
    report(f"column families per task, optimized:   {families['optimized'][0]}")
    report(f"column families per task, unoptimized: {families['unoptimized'][0]}")

    # The same output, record for record (partition, key, value, timestamp, in topic order).
    assert len(outputs["optimized"]) > 3_000
    assert sum(v is None for _, _, v, _ in outputs["optimized"]) > 300
    assert outputs["optimized"] == outputs["unoptimized"]
    # ... and what the driver computes, per key in order.
    want = driver_output_by_key(lambda: apps.table_self_join_topology(inp, runs["optimized"][2]), inp,
                                runs["optimized"][2], kafka.read_topic(kafka_bootstrap, inp))
    assert by_key(kafka.read_topic(kafka_bootstrap, runs["optimized"][2])) == want
    report(f"{len(records)} input records -> {len(outputs['optimized'])} output records, identical both ways")
