"""Differential tests: the same random input under every emission policy.

For any input, (1) the final aggregate per key is the same under every policy and equals a
from-scratch computation over the final table, and (2) the ``on_change`` sequence equals the
``on_update`` sequence with each key's consecutive duplicates removed."""

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Emit, StreamsBuilder, TimeWindows
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

POLICIES = [Emit.on_update(), Emit.on_change(), Emit.every(50), Emit.every(50, clock="wall")]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcde"), st.sampled_from(["g0", "g1", "g2"]),
                  st.integers(0, 3), st.integers(0, 60)),
        st.tuples(st.just("del"), st.sampled_from("abcde"), st.integers(0, 60)),
        st.tuples(st.just("tick"), st.integers(1, 150)),
    ),
    max_size=60,
)


def sums_by_group(emit):
    b = StreamsBuilder()
    b.table("rows", value_serde=Serdes.json()) \
        .group_by(lambda k, v: (v["g"], v["n"])) \
        .aggregate(lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, emit=emit, name="sums") \
        .to_stream().to("out")
    return b.build()


def run(topology, script):
    ts = 0
    with TopologyTestDriver(topology) as d:
        for op in script:
            if op[0] == "tick":
                d.advance_wall_clock(op[1])
                continue
            ts += op[-1]
            if op[0] == "put":
                d.pipe_input("rows", op[1], {"g": op[2], "n": op[3]}, timestamp=ts)
            else:
                d.pipe_input("rows", op[1], None, timestamp=ts)
        store = d.get_store("sums").items()
    return [(r.key, r.value, r.timestamp) for r in d.read_output("out")], store


def final(sequence):
    last = {}
    for k, v, _ in sequence:
        last[k] = v
    return last


def collapse(sequence):
    """Drop a record whose value equals the previous record's value for the same key."""
    prev, out = {}, []
    for k, v, ts in sequence:
        if k in prev and prev[k] == v:
            continue
        prev[k] = v
        out.append((k, v, ts))
    return out


def assert_changes_of(on_change, on_update):
    """``on_change``'s records are ``on_update``'s without the no-ops: the same keys and values in
    order; each stamped no later (KIP-557: a no-op does not advance ``on_change``'s timestamp,
    while ``on_update``, as Kafka Streams, stores every update's)."""
    collapsed = collapse(on_update)
    assert [(k, v) for k, v, _ in on_change] == [(k, v) for k, v, _ in collapsed]
    assert all(a[2] <= b[2] for a, b in zip(on_change, collapsed, strict=True))


def from_scratch(script):
    rows, groups = {}, set()
    for op in script:
        if op[0] == "put":
            rows[op[1]] = (op[2], op[3])
            groups.add(op[2])
        elif op[0] == "del":
            rows.pop(op[1], None)
    sums = {g: 0 for g in groups}
    for g, n in rows.values():
        sums[g] += n
    return sums


@settings(max_examples=150, deadline=None)
@given(ops)
def test_table_aggregate_is_policy_independent(script):
    results = {repr(p): run(sums_by_group(p), script) for p in POLICIES}
    want = from_scratch(script)
    for name, (seq, store) in results.items():
        assert final(seq) == want, name
        assert dict(store) == want, name
    on_update = results["Emit.on_update()"][0]
    on_change = results["Emit.on_change()"][0]
    assert_changes_of(on_change, on_update)
    for name in ("Emit.every(50)", "Emit.every(50, clock='wall')"):
        seq = results[name][0]
        assert len(seq) <= len(on_change)
        assert all(k in want for k, _, _ in seq)


stream_ops = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 4), st.integers(0, 40)), max_size=60)


def windowed_max(emit):
    b = StreamsBuilder()
    b.stream("nums").group_by_key().windowed_by(TimeWindows.of(20).advance_by(10).grace(15)) \
        .reduce(max, emit=emit, name="max").to_stream().to("out")
    return b.build()


@settings(max_examples=150, deadline=None)
@given(stream_ops)
def test_windowed_aggregate_on_window_close_emits_each_closed_window_once_with_its_final_value(script):
    def go(emit):
        with TopologyTestDriver(windowed_max(emit)) as d:
            ts = ts_max = 0
            for key, value, dt in script:
                ts += dt - 10  # out-of-order and late records too (clamped at 0)
                ts = max(ts, 0)
                ts_max = max(ts_max, ts)
                d.pipe_input("nums", key, value, timestamp=ts)
            stream_time = ts_max
        return [(r.key, r.value, r.timestamp) for r in d.read_output("out")], stream_time

    on_update, _ = go(Emit.on_update())
    on_change, _ = go(Emit.on_change())
    closed, stream_time = go(Emit.on_window_close())
    assert_changes_of(on_change, on_update)
    keys = [k for k, _, _ in closed]
    assert len(keys) == len(set(keys))                      # each window once
    assert all(k.end + 15 <= stream_time for k in keys)     # and only once it closed
    last = final(on_change)
    assert {k: v for k, v, _ in closed} == {k: v for k, v in last.items() if k.end + 15 <= stream_time}
    per_key_ts = defaultdict(list)
    for k, _v, ts in on_change:
        per_key_ts[k].append(ts)
    for k, _v, ts in closed:                                 # carries the last real change's timestamp
        assert ts == per_key_ts[k][-1]
