"""Time-ordered processing of a backlog (issue 34): topics that hold their history before the
worker starts, read by tasks with several input partitions.

A stream-table join: every user's region is A at t=1,000 and B at t=1,000,000; each user clicks
at t=500,000 and again at t=2,000,000. Kafka Streams joins the early click with A and the late
one with B; a worker handing records to tasks in fetch order joined none of them (the click
topic was fetched before the users one). A stream-stream join (100 ms windows, no grace) of two
topics produced one after the other: in fetch order the right side comes after stream time
passed every left record.

On 1, 2 and 4 partitions and under both processing guarantees (with a timestamp extractor
reading the event time from the payload, broker timestamps backwards: on 2 and 4): the join results are exactly the
model's (per key, in order), and every output and store equals the test driver's fed each
partition's records in time order (ties: the topic name) — the order the backfill merges in."""

import json
import random

import pytest

from processor import JoinWindows, StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, task_store_bytes

USERS = 60


def payload_time(k, v, ts):
    return v["t"]


def topology_for(t, extract=False):
    """``extract``: every source takes its event time from the payload's ``t``."""
    x = payload_time if extract else None
    b = StreamsBuilder()
    users = b.table(t["users"], store_name="users", timestamp_extractor=x)
    b.stream(t["clicks"], timestamp_extractor=x).join(
        users, lambda c, u: {"click": c["n"], "region": u["region"]}).to(t["enriched"])
    left = b.stream(t["left"], timestamp_extractor=x)
    left.join(b.stream(t["right"], timestamp_extractor=x), lambda lv, rv: {"l": lv["n"], "r": rv["n"]},
              JoinWindows.of(100), name="lr").to(t["pairs"])
    return b.build()


BROKER_T0 = 5_000_000_000


def produce_history(bootstrap, t, h, extract=False):
    """The history, the streams' topics first (fetch order alone would process every click
    before any user row). ``extract``: each value carries its time as ``t`` and the broker
    timestamps run backwards (ordering by them would be wrong everywhere)."""
    for name in ("clicks", "left", "right", "users"):
        if extract:
            produce(bootstrap, t[name], [(k, json.dumps({**v, "t": ts}).encode()) for k, v, ts in h[name]],
                    timestamps=[BROKER_T0 - ts for _, _, ts in h[name]])
        else:
            produce(bootstrap, t[name], [(k, json.dumps(v).encode()) for k, v, _ in h[name]],
                    timestamps=[ts for _, _, ts in h[name]])


def event_time_of(m, extract: bool) -> int:
    return json.loads(m.value())["t"] if extract else m.timestamp()[1]


def model_pairs(h):
    """Each left record meets the right one of its key and step within 100 ms."""
    return sorted((lv["n"], rv["n"]) for lk, lv, lt in h["left"] for rk, rv, rt in h["right"]
                  if lk == rk and abs(lt - rt) <= 100)


def pairs_of(seq_by_key):
    return sorted((p["l"], p["r"]) for seq in seq_by_key.values() for p in (json.loads(v) for v, _ in seq))


def driver_by_partition(t, inputs, partitions, app, extract, stores=("users",)):
    """The test driver fed each partition's records in event-time order (ties: topic name): its
    outputs by key and its stores."""
    want = {"enriched": {}, "pairs": {}}
    stored = {}
    for part in range(partitions):
        merged = sorted(((event_time_of(m, extract), t[name], m.offset(), m) for name, ms in inputs.items()
                         for m in ms if m.partition() == part), key=lambda r: r[:3])
        with TopologyTestDriver(topology_for(t, extract), application_id=app) as d:
            for _, topic, _, m in merged:
                d.pipe_raw(topic, m.key(), m.value(), m.timestamp()[1])
            for o in want:
                for r in d.read_output(t[o], Serdes.bytes(), Serdes.bytes()):
                    want[o].setdefault(r.key, []).append((r.value, r.timestamp))
            stored[part] = driver_store_bytes(d, list(stores))
    return want, stored


def history(users_n: int = USERS, steps: int = 20):
    """(topic, key, value, timestamp) per input topic, each topic in time order."""
    rnd = random.Random(34)
    users = [(f"u{i:03d}".encode(), {"region": "A"}, 1_000) for i in range(users_n)]
    users += [(f"u{i:03d}".encode(), {"region": "B"}, 1_000_000) for i in range(users_n)]
    clicks = [(f"u{i:03d}".encode(), {"n": 2 * i}, 500_000 + i) for i in range(users_n)]
    clicks += [(f"u{i:03d}".encode(), {"n": 2 * i + 1}, 2_000_000 + i) for i in range(users_n)]
    left, right = [], []
    for step in range(steps):
        for i in range(20):
            k = f"s{i:02d}".encode()
            left.append((k, {"n": step * 100 + i}, 10_000 + step * 1_000 + rnd.randrange(0, 50)))
            right.append((k, {"n": step * 100 + i}, 10_000 + step * 1_000 + rnd.randrange(60, 150)))
    for rows in (left, right):
        rows.sort(key=lambda r: r[2])
    return {"users": users, "clicks": clicks, "left": left, "right": right}


def model_enriched(h):
    """Each click joins the region its user had at the click's time."""
    out = {}
    for k, v, ts in h["clicks"]:
        region = "A" if ts < 1_000_000 else "B"
        out.setdefault(k, []).append(({"click": v["n"], "region": region}, ts))
    return out


def enriched_of(seq_by_key):
    """{key: [(value without its t, timestamp)]}"""
    return {k: [({f: x for f, x in json.loads(v).items() if f != "t"}, ts) for v, ts in seq]
            for k, seq in seq_by_key.items()}


CASES = [(p, g, False) for p in (1, 2, 4) for g in ("at_least_once", "exactly_once")] + \
    [(p, g, True) for p in (2, 4) for g in ("at_least_once", "exactly_once")]


@pytest.mark.parametrize("partitions,guarantee,extract", CASES,
                         ids=[f"{p}-{g}-{'payload' if x else 'record'}-time" for p, g, x in CASES])
def test_backlog_is_processed_in_time_order(kafka_bootstrap, unique, tmp_path, partitions, guarantee, extract):
    t = {n: f"tob-{n}-{partitions}-{int(extract)}-{unique}"
         for n in ("users", "clicks", "enriched", "left", "right", "pairs")}
    kafka.create_topics(kafka_bootstrap, {v: partitions for v in t.values()})
    h = history()
    # the history is there before the worker starts
    produce_history(kafka_bootstrap, t, h, extract)
    app = f"tob-{partitions}-{int(extract)}-{unique}"
    w = Worker(topology_for(t, extract), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG, processing_guarantee=guarantee)
    w.run(until_drained=True, install_signal_handlers=False)
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    got = {o: by_key(kafka.read_topic(kafka_bootstrap, t[o], isolation_level=isolation))
           for o in ("enriched", "pairs")}

    # the model: every click with the region of its time, at its time
    assert enriched_of(got["enriched"]) == model_enriched(h)
    assert pairs_of(got["pairs"]) == model_pairs(h)
    assert len(model_pairs(h)) > 250
    counters = w.metrics()
    assert counters["task"].get("idle_waits", 0) >= 1   # a task waited for its other partition

    # the driver, fed each partition in time order (ties: topic name), as the backfill merges
    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks", "left", "right")}
    want, stored = driver_by_partition(t, inputs, partitions, app, extract)
    subs = w.topology.subtopology_of_topic()
    for part in range(partitions):
        got_store = task_store_bytes([tmp_path / app / f"task-{subs[t['users']]}_{part}"], ["users"])
        assert got_store == stored[part], part
    assert got == want
