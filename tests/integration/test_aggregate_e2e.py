"""Aggregations end to end on a real broker: 100,000 stream records with a skewed key distribution
on 4 partitions, one topology with an aggregate per emission policy. Per policy the figures
(input records vs emitted records) are reported, and the broker's output equals the driver's:
key by key and in order for the aggregates grouped by key (a task sees one input partition, so
one driver per input partition is the exact oracle, flush on close included), final values for
the sum per region (its input crosses a repartition topic, where partitions interleave)."""

import json
import random
from collections import Counter

from processor.graph import AggregateAttrs
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import by_key, driver_outputs_by_key, produce, skewed_events

N = 100_000
PER_KEY = ("on-update", "on-change", "every-1000", "window-close")


def test_aggregates_per_policy_on_broker_equal_driver(kafka_bootstrap, unique, tmp_path, monkeypatch, report):
    inp, prefix, app = f"events-{unique}", f"agg-{unique}", f"app-{unique}"
    outs = {s: f"{prefix}-{s}" for s in apps.POLICY_OUTPUTS}
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT_PREFIX", prefix)
    kafka.create_topics(kafka_bootstrap, {inp: 4, **{t: 4 for t in outs.values()}})

    records = skewed_events(N, keys=2_000, seed=3)
    # 1 ms per record; 1 % of the records arrive 2..15 s late (out of order; some beyond the
    # windows' grace, so the windowed count drops them).
    rnd = random.Random(4)
    timestamps = [1_000_000 + i - (rnd.randrange(2_000, 15_000) if rnd.random() < 0.01 else 0)
                  for i in range(N)]
    key_counts = Counter(k for k, _ in records)
    hottest = key_counts.most_common(1)[0][1]
    assert hottest > N // 10 and len(key_counts) > 1_000   # skewed: one key >10 %, a long tail
    ends = produce(kafka_bootstrap, inp, records, timestamps=timestamps)
    assert sorted(ends) == [0, 1, 2, 3] and sum(ends.values()) == N

    w = Worker(apps.aggregate_policies_topology(), kafka_bootstrap, app, tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == N + N   # the input, then the same records via the repartition topic

    got = {s: by_key(kafka.read_topic(kafka_bootstrap, t)) for s, t in outs.items()}
    input_messages = kafka.read_topic(kafka_bootstrap, inp)
    assert len(input_messages) == N
    want = driver_outputs_by_key(apps.aggregate_policies_topology, inp, [outs[s] for s in PER_KEY],
                                 input_messages)
    want_all = driver_outputs_by_key(apps.aggregate_policies_topology, inp, [outs["sum-by-region"]],
                                     input_messages, per_partition=False)

    emitted = {s: sum(map(len, got[s].values())) for s in outs}
    m = w.metrics()
    store_of = {n.name: n.stores[0] for n in w.topology.nodes if isinstance(n.attrs, AggregateAttrs)}
    counters = {store_of[node]: c for node, c in m.items() if node in store_of}
    report(f"input: {N} records, {len(key_counts)} keys (hottest {hottest}), 4 partitions "
           f"{[ends[p] for p in range(4)]}; worker {w.records_processed} records incl. repartition")
    for s, store in zip(apps.POLICY_OUTPUTS, ("max-on-update", "max-on-change", "max-every-1000",
                                              "count-10s", "sum-by-region"), strict=False):
        c = counters[store]
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("records_in", "records_emitted") and v)
        report(f"{store:15} {c['records_in']:>7} in -> {emitted[s]:>7} emitted ({extra})")

    # Exact per-key sequences (value bytes and timestamps) for the aggregates grouped by key.
    for s in PER_KEY:
        assert got[s] == want[outs[s]], s

    # Final sums per region: the driver's, and the plain sums of the input.
    sums = Counter()
    for _, v in records:
        d = json.loads(v)
        sums[d["region"]] += d["amount"]
    got_final = {k: seq[-1][0] for k, seq in got["sum-by-region"].items()}
    want_final = {k: seq[-1][0] for k, seq in want_all[outs["sum-by-region"]].items()}
    assert got_final == want_final
    assert {k.decode(): json.loads(v) for k, v in got_final.items()} == dict(sums)

    # Emission counts per policy: what each policy saves, and the worker's own counters agree.
    assert emitted["on-update"] == N
    assert emitted["every-1000"] < emitted["on-change"] < emitted["on-update"]
    assert emitted["on-change"] < N // 10
    assert counters["max-on-change"]["noop_updates_skipped"] == N - emitted["on-change"]
    assert counters["max-every-1000"]["emissions_deferred"] > 0
    assert counters["count-10s"]["late_records_dropped"] > 0
    assert 0 < emitted["window-close"] < N
    assert emitted["sum-by-region"] <= N
    for s, store in (("on-update", "max-on-update"), ("on-change", "max-on-change"),
                     ("every-1000", "max-every-1000"), ("window-close", "count-10s"),
                     ("sum-by-region", "sum-by-region")):
        assert counters[store]["records_in"] == N, s
        assert counters[store]["records_emitted"] == emitted[s], s
