"""DSL stores in ``process()`` (issue 34, item 5) on a real broker: the topology of
``tests/unit/test_processor_api_dsl_stores.py`` (a table's store read with each row's timestamp
by a processor on another topic and by one on the table's own changes, a count's store, a
Processor API store) run by ``Worker``s over 3 partitions, in phases: table updates, clicks,
more updates, more clicks, each phase drained before the next, so every task sees one topic at
a time (what the test driver is fed per partition, in the same order).

- Outputs: per key, exactly the driver's sequence.
- Stores: byte for byte the driver's (the 8-byte row timestamps included).
- The last phase runs on a second worker with an empty state directory: the stores are restored
  from their changelogs, and the clicks of that phase read the restored rows' timestamps, equal
  to the driver's (which never restored anything)."""

import json
import random
from collections import defaultdict

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, task_store_bytes
from tests.unit.test_processor_api_dsl_stores import dsl_stores_topology

STORES = ("users", "last", "clicks-per-user", "clicks-per-user.emitted", "enriched-last")


def _js(v):
    return json.dumps(v, separators=(",", ":")).encode()


def _phase(rnd, name, n, t0):
    """(key, value bytes, timestamp) of one phase: users rows (from a small domain, so no-op
    updates happen; deletes) or clicks; timestamps mostly increasing, a few older."""
    out = []
    for i in range(n):
        k = f"u{rnd.randrange(60):02d}".encode()
        ts = t0 + i * 2 - (7 if i % 9 == 4 else 0)
        if name == "users":
            v = None if rnd.random() < 0.1 else _js({"tier": rnd.choice("ab"), "region": rnd.choice("xy")})
        else:
            v = _js({"x": rnd.randrange(100)})
        out.append((k, v, ts))
    return out


def test_dsl_stores_in_process_on_the_broker_equal_the_driver_and_restore(kafka_bootstrap, unique, tmp_path):
    t = {n: f"pds-{n}-{unique}" for n in ("users", "clicks", "enriched", "stamped", "counted")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    app = f"pds-{unique}"
    rnd = random.Random(34)
    phases = [("users", 400, 1_000_000), ("clicks", 900, 2_000_000), ("users", 400, 3_000_000),
              ("clicks", 900, 4_000_000)]
    for i, (name, n, t0) in enumerate(phases):
        recs = _phase(rnd, name, n, t0)
        produce(kafka_bootstrap, t[name], [(k, v) for k, v, _ in recs], timestamps=[ts for _, _, ts in recs])
        state = tmp_path / ("w2" if i == len(phases) - 1 else "w1")   # the last phase: restored first
        w = Worker(dsl_stores_topology(t), kafka_bootstrap, app, state, commit_interval_ms=200,
                   consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        if i == len(phases) - 1:
            assert w.records_processed == 900 + 900  # its clicks (and their repartitioned records) only

    # the driver: per input partition, the phases in the same order
    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks")}
    # each phase's timestamps lie in a million of their own; offsets follow the phases
    per_phase = [(name, [m for m in inputs[name] if m.timestamp()[1] // 1_000_000 == t0 // 1_000_000])
                 for name, _, t0 in phases]
    assert [len(msgs) for _, msgs in per_phase] == [n for _, n, _ in phases]
    outs = ("enriched", "stamped", "counted")
    want: dict = {o: defaultdict(list) for o in outs}
    stores = {s: {} for s in STORES}
    for part in range(3):
        with TopologyTestDriver(dsl_stores_topology(t), application_id=app) as d:
            for name, msgs in per_phase:
                for m in msgs:
                    if m.partition() == part:
                        d.pipe_raw(t[name], m.key(), m.value(), m.timestamp()[1])
            for o in outs:
                for r in d.read_output(t[o], Serdes.bytes(), Serdes.bytes()):
                    want[o][r.key].append((r.value, r.timestamp))
            for s, entries in driver_store_bytes(d, STORES).items():
                stores[s].update(entries)
    for o in outs:
        assert by_key(kafka.read_topic(kafka_bootstrap, t[o])) == want[o], o
    restored = task_store_bytes(sorted((tmp_path / "w2" / app).glob("task-*")), STORES)
    assert restored == stores
    # the outputs read what the model distinguishes: rows with timestamps older than the click,
    # clicks of keys with no row, and (in the last phase) rows restored from the changelog
    enriched = [json.loads(v) for seq in want["enriched"].values() for v, _ in seq]
    assert sum(e["row"] is None for e in enriched) > 50 and sum(e["row"] is not None for e in enriched) > 900
    assert {e["row"][1] // 1_000_000 for e in enriched if e["row"]} == {1, 3}
    assert sum(len(v) for v in want["stamped"].values()) > 300



def test_a_processor_reading_a_table_of_another_partition_count_is_refused_at_start(kafka_bootstrap, unique,
                                                                                     tmp_path):
    import pytest

    from processor.errors import ConfigError

    t = {n: f"pdsn-{n}-{unique}" for n in ("users", "clicks", "enriched", "stamped", "counted")}
    kafka.create_topics(kafka_bootstrap, {**{v: 3 for v in t.values()}, t["users"]: 2})
    w = Worker(dsl_stores_topology(t), kafka_bootstrap, f"pdsn-{unique}", tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(ConfigError, match=f"co-partitioned source topics of sub-topology 0 have different partition "
                                          f"counts \\({t['clicks']}=3, {t['users']}=2\\)"):
        w.run(until_drained=True, install_signal_handlers=False)
