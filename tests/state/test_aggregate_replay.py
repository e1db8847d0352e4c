"""Emit-on-change under replay, on real RocksDB: a crash after forwarding and before committing
replays the records; their emissions happen again (none lost) and the aggregates stay exact,
also across the repartition topic (its replayed records are dropped by provenance)."""

import json
import random

from processor import Emit, StreamsBuilder
from processor.engine.task import Task
from processor.state.rocksdb import RocksDBDatabase
from tests.support.collectors import TopicLog


def topology():
    b = StreamsBuilder()
    s = b.stream("events")
    s.group_by(lambda k, v: v["g"]).aggregate(lambda: 0, lambda k, v, agg: agg + v["n"], name="sums",
                                              emit=Emit.on_change()).to_stream().to("sums")
    s.group_by_key().reduce(lambda agg, v: {"m": max(agg["m"], v["m"])}, name="max",
                            emit=Emit.on_change()).to_stream().to("max")
    return b.build().for_application("app")


def run(inputs, state, log, crash_after=None, commit_every=7):
    """Process ``events`` and the repartition topic from the tasks' checkpoints, committing every
    ``commit_every`` records; with ``crash_after`` stop at that input offset without committing."""
    topo = topology()
    rep = "app-sums-repartition"
    up = Task(topo, 0, 0, RocksDBDatabase(state / "up"), log, lambda: 0, on_error="fail")
    down = Task(topo, 1, 0, RocksDBDatabase(state / "down"), log, lambda: 0, on_error="fail")
    try:
        for off in range(up.positions.get(("events", 0), 0), len(inputs)):
            k, v, ts = inputs[off]
            up.process("events", 0, off, ts, k, v)
            start = down.positions.get((rep, 0), 0)
            for roff in range(start, len(log.topics.get(rep, []))):
                rk, rv, rts, rh = log.topics[rep][roff]
                down.process(rep, 0, roff, rts, rk, rv, rh)
            if crash_after is not None and off == crash_after:
                return  # forwarded, not committed
            if off % commit_every == 0:
                up.commit()
                down.commit()
        up.commit()
        down.commit()
        return {k: v for k, v, _, _ in log.topics["sums"]}, list(down.stores.store("sums").items())
    finally:
        up.close()
        down.close()


def test_crash_between_forwarding_and_committing_loses_no_emission(tmp_path):
    rnd = random.Random(3)
    inputs = [(f"k{rnd.randrange(5)}".encode(),
               json.dumps({"g": f"g{rnd.randrange(3)}", "n": rnd.randrange(4), "m": rnd.randrange(i + 1)}).encode(), i)
              for i in range(300)]
    clean_log = TopicLog()
    clean_final, clean_store = run(inputs, tmp_path / "clean", clean_log)
    clean_store = list(clean_store)

    log = TopicLog()
    run(inputs, tmp_path / "crashed", log, crash_after=150)
    before = {t: len(v) for t, v in log.topics.items()}
    final, store = run(inputs, tmp_path / "crashed", log)

    assert final == clean_final
    assert list(store) == clean_store
    for topic in ("sums", "max"):
        got, want = log.topics[topic], clean_log.topics[topic]
        assert len(got) > len(want), "the crash replayed nothing: the test did not test"
        it = iter((k, v, ts) for k, v, ts, _ in got)
        assert all(any(x == w for x in it) for w in [(k, v, ts) for k, v, ts, _ in want]), \
            f"an emission of {topic} was lost"
    rep = log.topics["app-sums-repartition"]
    assert len(rep) > before["app-sums-repartition"] >= 150   # the repartition topic holds replays
