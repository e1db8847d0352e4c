"""A poison mix on the broker: every input record ends processed or dead-lettered, under both
guarantees and every ``--on-error`` policy.

The input (Avro values, produced with confluent-kafka's default partitioner) mixes good
records with three kinds of failure: bytes that are not Avro, values on which the table
filter's predicate raises, and values whose mapped output is larger than ``message.max.bytes``.
Under ``dlq`` the dead-letter topic holds exactly the failing records, once each, with KIP-1034's
headers; under ``skip`` they are counted; and in both the outputs equal what the broker-free
driver produces from the same input without the failing records (a record that fails leaves
nothing behind). Under ``fail`` the worker stops at the first one, naming it, and no output of
it or after it in its partition exists.
"""

import random

import pytest

from processor import StreamsBuilder
from processor.errors import RecordError
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import committed_offsets, final_table, produce_with_partitioner

SCHEMA = {"type": "record", "name": "Order",
          "fields": [{"name": "amount", "type": "long"}, {"name": "region", "type": "string"}]}
AVRO = Serdes.avro(SCHEMA)
PARTS = 2
HUGE = "x" * 1_100_000


def why_bad(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        v = AVRO.deserialize(value)
    except Exception:
        return "not Avro"
    if v["amount"] % 7 == 0:
        return "predicate raises"
    if v["amount"] % 11 == 0:
        return "output too large"
    return None


def topology_for(t):
    def factory():
        b = StreamsBuilder()
        orders = b.table(t["orders"], value_serde=AVRO, store_name="orders")

        def even(k, v):
            if v["amount"] % 7 == 0:
                raise ValueError(f"amount {v['amount']} is a multiple of 7")
            return v["amount"] % 2 == 0

        orders.filter(even).to_stream().to(t["even"])
        orders.map_values(lambda v: {"pad": HUGE} if v["amount"] % 11 == 0 else {"a": v["amount"]},
                          value_serde=Serdes.json()).to_stream().to(t["wide"])
        orders.group_by(lambda k, v: (v["region"], v["amount"]), key_serde=Serdes.string(),
                        value_serde=Serdes.json()).aggregate(
            lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="amount-by-region"
        ).to_stream().to(t["sums"])
        return b.build()
    return factory


def history(n=900, keys=60, seed=11):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key = f"o{rng.randrange(keys):03d}".encode()
        r = rng.random()
        if r < 0.05:
            value = None
        else:
            value = AVRO.serialize({"amount": rng.randrange(1, 100), "region": rng.choice("abc")})
            if r < 0.15:
                value = value[:-1]          # truncated: not Avro
        out.append((key, value))
    return out


def expected(factory, placed, t):
    """Per partition, the driver over the records that do not fail (each key lives in one
    partition, so per-key sequences are the worker's); the aggregate's final table. Record
    ``i`` was produced at timestamp ``1_000_000 + i``."""
    by_part = {}
    for i, ((_, key, part, _), (_, value)) in enumerate(placed):
        if why_bad(value) is None:
            by_part.setdefault(part, []).append((key, value, 1_000_000 + i))
    seqs = {t["even"]: {}, t["wide"]: {}}
    sums = {}
    for part in sorted(by_part):
        with TopologyTestDriver(factory(), on_error="fail") as d:
            for key, value, ts in by_part[part]:
                d.pipe_raw(t["orders"], key, value, timestamp=ts)
            for topic in seqs:
                for r in d.read_output(topic, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()):
                    seqs[topic].setdefault(r.key, []).append(r.value)
    # the sums gather every partition: one driver over all of it (the final sums do not depend
    # on how the partitions interleave)
    with TopologyTestDriver(factory(), on_error="fail") as d:
        for i, ((_, key, _, _), (_, value)) in enumerate(placed):
            if why_bad(value) is None:
                d.pipe_raw(t["orders"], key, value, timestamp=1_000_000 + i)
        for r in d.read_output(t["sums"], key_serde=Serdes.bytes(), value_serde=Serdes.bytes()):
            sums.setdefault(r.key, []).append(r.value)
    return seqs, sums


def per_key(messages):
    out = {}
    for m in messages:
        out.setdefault(m.key(), []).append(m.value())
    return out


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("policy", ["dlq", "skip"])
def test_every_input_record_ends_processed_or_dead_lettered(kafka_bootstrap, unique, tmp_path, report,
                                                            guarantee, policy):
    tag = f"{policy}-{guarantee[:2]}-{unique}"
    t = {name: f"pm-{name}-{tag}" for name in ("orders", "even", "wide", "sums")}
    kafka.create_topics(kafka_bootstrap, {t["orders"]: PARTS, t["even"]: PARTS, t["wide"]: PARTS, t["sums"]: PARTS})
    recs = history()
    placed = list(zip(produce_with_partitioner(kafka_bootstrap, [(t["orders"], k, v) for k, v in recs],
                                               "consistent_random"), recs, strict=False))
    bad = sorted((part, off, why_bad(value)) for (_, _, part, off), (_, value) in placed if why_bad(value))
    kinds = {k: sum(1 for *_, w in bad if w == k) for k in ("not Avro", "predicate raises", "output too large")}
    assert all(kinds.values()), kinds

    factory = topology_for(t)
    app = f"pm-app-{tag}"
    w = Worker(factory(), kafka_bootstrap, app, tmp_path / "state", consumer_config=TEST_CONSUMER_CONFIG,
               on_error=policy, processing_guarantee=guarantee)
    w.run(until_drained=True, install_signal_handlers=False)

    # every input record was consumed and committed
    committed = committed_offsets(kafka_bootstrap, app, t["orders"], PARTS)
    per_part = {p: sum(1 for (_, _, part, _), _ in placed if part == p) for p in range(PARTS)}
    assert committed == per_part, (committed, per_part)

    metrics = w.metrics()["task"]
    if policy == "dlq":
        dlq = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
        got = []
        for m in dlq:
            h = dict(m.headers())
            assert h["__streams.errors.topic"] == t["orders"].encode()
            got.append((int(h["__streams.errors.partition"]), int(h["__streams.errors.offset"]),
                        h["__streams.errors.exception"].decode()))
        # each failing record exactly once, with its original bytes
        assert sorted((p, o) for p, o, _ in got) == [(p, o) for p, o, _ in bad]
        by_pos = {(part, off): value for (_, _, part, off), (_, value) in placed}
        assert all(m.value() == by_pos[(int(dict(m.headers())["__streams.errors.partition"]),
                                        int(dict(m.headers())["__streams.errors.offset"]))] for m in dlq)
        exc_of = {"not Avro": "EOFError", "predicate raises": "ValueError",
                  "output too large": "processor.errors.OutputError"}
        assert sorted(got) == sorted((p, o, exc_of[w_]) for p, o, w_ in bad)
        assert metrics["dead_lettered"] == len(bad) and metrics["skipped_poison"] == 0
    else:
        assert metrics["skipped_poison"] == len(bad) and metrics["dead_lettered"] == 0

    # outputs: exactly the driver's over the records that do not fail
    want_seqs, want_sums = expected(factory, placed, t)
    for topic in (t["even"], t["wide"]):
        assert per_key(kafka.read_topic(kafka_bootstrap, topic)) == want_seqs[topic], topic
    got_sums = final_table(kafka.read_topic(kafka_bootstrap, t["sums"]))
    assert got_sums == {k: v[-1] for k, v in want_sums.items() if v[-1] is not None}
    report(f"{policy}/{guarantee}: {len(recs)} input records, {len(bad)} failing "
           f"({', '.join(f'{k}: {v}' for k, v in kinds.items())}) -> "
           f"{'dead-lettered once each' if policy == 'dlq' else 'skipped'}; outputs equal the driver's "
           f"without them ({sum(len(v) for v in want_seqs[t['even']].values())} + "
           f"{sum(len(v) for v in want_seqs[t['wide']].values())} records)")


def test_fail_policy_stops_at_the_first_failing_record(kafka_bootstrap, unique, tmp_path, report):
    tag = f"fail-{unique}"
    t = {name: f"pm-{name}-{tag}" for name in ("orders", "even", "wide", "sums")}
    kafka.create_topics(kafka_bootstrap, {t["orders"]: 1, t["even"]: 1, t["wide"]: 1, t["sums"]: 1})
    good = [(f"k{i}".encode(), AVRO.serialize({"amount": a, "region": "a"})) for i, a in enumerate([2, 4, 6])]
    failing = (b"k9", AVRO.serialize({"amount": 21, "region": "a"}))
    after = (b"k5", AVRO.serialize({"amount": 8, "region": "a"}))
    produce_with_partitioner(kafka_bootstrap, [(t["orders"], k, v) for k, v in [*good, failing, after]],
                             "consistent_random")
    app = f"pm-app-{tag}"
    w = Worker(topology_for(t)(), kafka_bootstrap, app, tmp_path / "state", consumer_config=TEST_CONSUMER_CONFIG,
               on_error="fail")
    with pytest.raises(RecordError) as info:
        w.run(until_drained=True, install_signal_handlers=False)
    msg = str(info.value)
    assert msg.startswith(f"record {t['orders']}[0]@3, step KTABLE-FILTER-0000000001: user function "
                          f"topology_for.<locals>.factory.<locals>.even (test_poison_mix.py:"), msg
    assert msg.endswith("raised ValueError: amount 21 is a multiple of 7") and info.value.exit_code == 6
    assert committed_offsets(kafka_bootstrap, app, t["orders"], 1)[0] <= 3
    # nothing of the failing record or after it was written (what came before may or may not
    # have been delivered when the worker stopped)
    written = [m.key() for m in kafka.read_topic(kafka_bootstrap, t["even"], isolation_level="read_uncommitted")]
    assert written == [b"k0", b"k1", b"k2"][:len(written)], written
    report(f"fail: stopped at {t['orders']}[0]@3 with exit code 6: {msg[:90]}...")
