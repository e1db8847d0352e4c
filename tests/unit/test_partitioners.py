"""The pure-Python partitioners (``processor.engine.partitioners``) against published vectors,
``explaining`` on hand-made samples, and ``decide_partitioners`` (``processor.engine.routing``) on
built topologies with hand-made samples: declarations, ambiguity, co-partitioning constraints,
internal topics and one-partition topics. (Bit-for-bit agreement with librdkafka itself:
``tests/integration/test_partitioners_librdkafka.py``.)"""

import zlib

import pytest

from processor import StreamsBuilder
from processor.engine.partitioners import (
    CONSISTENT,
    FNV1A,
    INTERNAL,
    KNOWN,
    MURMUR2,
    PARTITIONERS,
    explaining,
    fnv1a,
    murmur2,
    resolve,
)
from processor.engine.routing import PartitioningError, Routing, decide_partitioners
from processor.errors import ConfigError, TopologyError

# Kafka's UtilsTest.testMurmur2: Utils.murmur2(bytes) as Java (signed) ints
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


@pytest.mark.parametrize("key", list(KAFKA_MURMUR2), ids=lambda k: k.decode()[:12])
def test_murmur2_equals_kafkas_utils_murmur2(key):
    assert _signed(murmur2(key)) == KAFKA_MURMUR2[key]
    # Java's default partitioner: Utils.toPositive(murmur2(key)) % n
    for n in (1, 3, 4, 7, 12):
        assert MURMUR2.partition(key, n) == (KAFKA_MURMUR2[key] & 0x7FFFFFFF) % n


def test_fnv1a_and_crc32_vectors():
    # FNV-1a 32-bit reference vectors (offset basis for the empty input)
    assert fnv1a(b"") == 0x811C9DC5
    assert fnv1a(b"a") == 0xE40C292C
    assert fnv1a(b"foobar") == 0xBF9CF968
    # librdkafka's fnv1a partitioner takes the hash as a signed int and its absolute value (Sarama)
    assert FNV1A.partition(b"a", 7) == ((1 << 32) - 0xE40C292C) % 7      # high bit set: negated
    assert FNV1A.partition(b"a", 7) != 0xE40C292C % 7                    # (the rule is visible here)
    assert FNV1A.partition(b"", 10) == ((1 << 32) - 0x811C9DC5) % 10    # 0x811C9DC5 is negative too
    assert FNV1A.partition(b"foobar", 1000) == ((1 << 32) - 0xBF9CF968) % 1000
    # CRC-32 check value of "123456789"
    assert CONSISTENT.partition(b"123456789", 1000) == 0xCBF43926 % 1000
    assert CONSISTENT.partition(b"123456789", 7) == zlib.crc32(b"123456789") % 7


def test_names_resolve_to_families_and_random_is_refused():
    assert {name: p.name for name, p in PARTITIONERS.items()} == {
        "murmur2": "murmur2", "murmur2_random": "murmur2",
        "consistent": "consistent", "consistent_random": "consistent",
        "fnv1a": "fnv1a", "fnv1a_random": "fnv1a"}
    assert resolve("consistent_random") is CONSISTENT
    assert resolve("murmur2") is MURMUR2 is INTERNAL
    assert list(KNOWN) == [MURMUR2, CONSISTENT, FNV1A]
    for bad in ("random", "Murmur2", "crc32", ""):
        with pytest.raises(ValueError, match="unknown partitioner"):
            resolve(bad)
    # and a source declared with one is refused when the topology is built
    with pytest.raises(TopologyError, match="unknown partitioner 'random'"):
        StreamsBuilder().table("t", partitioner="random")


def test_places():
    for p in KNOWN:
        assert p.places(None) is False
        assert p.places(b"x") is True
        assert p.places(b"\x00") is True
    # consistent_random spreads an empty key like a null key; the other families hash it
    assert CONSISTENT.places(b"") is False
    assert MURMUR2.places(b"") is True
    assert FNV1A.places(b"") is True


# -- explaining ----------------------------------------------------------------------------------

def _keys(pred, count, n=4, prefix="k"):
    """The first ``count`` keys ``prefix<i>`` for which ``pred(partitions by family)`` holds."""
    out = []
    for i in range(100_000):
        k = f"{prefix}{i}".encode()
        m, c, f = (p.partition(k, n) for p in KNOWN)
        if pred(m, c, f):
            out.append(k)
            if len(out) == count:
                return out
    raise AssertionError("not enough keys")


DISTINCT = _keys(lambda m, c, f: len({m, c, f}) == 3, 20)          # every family elsewhere
MC_AGREE = _keys(lambda m, c, f: m == c != f, 6)                    # murmur2 = consistent, not fnv1a
ALL_AGREE = _keys(lambda m, c, f: m == c == f, 3)


def test_explaining_picks_the_family_that_placed_the_keys():
    for p in KNOWN:
        samples = [(k, p.partition(k, 4)) for k in DISTINCT[:5]]
        assert explaining(samples, 4) == [p]


def test_explaining_keeps_every_family_the_keys_do_not_tell_apart_in_preference_order():
    assert explaining([], 4) == [MURMUR2, CONSISTENT, FNV1A]
    assert explaining([(None, 3), (None, 0)], 4) == [MURMUR2, CONSISTENT, FNV1A]    # null keys say nothing
    assert explaining([(k, MURMUR2.partition(k, 4)) for k in ALL_AGREE], 4) == [MURMUR2, CONSISTENT, FNV1A]
    assert explaining([(k, MURMUR2.partition(k, 4)) for k in MC_AGREE], 4) == [MURMUR2, CONSISTENT]
    # one partition: every key is in partition 0 under every family
    assert explaining([(k, 0) for k in DISTINCT], 1) == [MURMUR2, CONSISTENT, FNV1A]


def test_explaining_nothing_when_one_key_contradicts_every_family():
    k = DISTINCT[0]
    nowhere = ({0, 1, 2, 3} - {p.partition(k, 4) for p in KNOWN}).pop()
    samples = [(x, CONSISTENT.partition(x, 4)) for x in DISTINCT[1:6]] + [(k, nowhere)]
    assert explaining(samples, 4) == []
    # a mix of two families is explained by neither
    mixed = [(DISTINCT[1], MURMUR2.partition(DISTINCT[1], 4)), (DISTINCT[2], CONSISTENT.partition(DISTINCT[2], 4))]
    assert explaining(mixed, 4) == []



def test_explaining_ignores_an_empty_key_that_consistent_random_spread_at_random():
    """consistent_random puts an empty key on a random partition (``CONSISTENT.places(b"")`` is
    False, and the Task's check skips it), so an empty-key sample must not rule CONSISTENT out."""
    samples = [(k, CONSISTENT.partition(k, 4)) for k in DISTINCT[:8]]
    spread = ({0, 1, 2, 3} - {CONSISTENT.partition(b"", 4)}).pop()
    assert explaining(samples, 4) == [CONSISTENT]
    assert explaining(samples + [(b"", spread)], 4) == [CONSISTENT]


# -- decide_partitioners on built topologies ---------------------------------------------------

def _samples(topic_keys: dict[str, list[tuple[bytes, int]]]):
    """``{topic: [(key, partition, offset)]}`` with offsets counted per partition."""
    out = {}
    for t, pairs in topic_keys.items():
        seen: dict[int, int] = {}
        rows = []
        for k, p in pairs:
            rows.append((k, p, seen.get(p, 0)))
            seen[p] = seen.get(p, 0) + 1
        out[t] = rows
    return out


def placed(p, keys, n=4):
    return [(k, p.partition(k, n)) for k in keys]


def fk_topology(right_partitioner=None, left_partitioner=None):
    b = StreamsBuilder()
    orders = b.table("orders", partitioner=left_partitioner)
    customers = b.table("customers", partitioner=right_partitioner)
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: [o, c], how="left",
                               name="fk").to_stream().to("out")
    return b.build()


def pk_topology(repartition_left=False, left="A", right="B"):
    b = StreamsBuilder()
    a = b.table(left, repartition=repartition_left)
    c = b.table(right)
    a.join(c, lambda x, y: [x, y], name="pk").to_stream().to("out")
    return b.build()


def test_fk_join_detects_the_right_tables_partitioner_and_ignores_the_left():
    topo = fk_topology()
    assert topo.partitioning_relevant_topics() == ["customers"]
    for p in KNOWN:
        samples = _samples({"customers": placed(p, DISTINCT) + [(None, 2)],
                            # the left table's placement does not matter to an FK join
                            "orders": placed(FNV1A if p is not FNV1A else CONSISTENT, DISTINCT)})
        choices = decide_partitioners(topo, {"customers": 4, "orders": 4}, samples)
        assert sorted(choices) == ["customers"]
        c = choices["customers"]
        assert (c.topic, c.partitioner, c.how, c.checked) == ("customers", p, "detected from 20 sampled keys", True)
        assert str(c) == f"{p.name} (detected from 20 sampled keys; checked as consumed)"


def test_empty_topic_defaults_to_murmur2_and_is_checked():
    choices = decide_partitioners(fk_topology(), {"customers": 4, "orders": 4}, {"customers": [(None, 1, 0)]})
    c = choices["customers"]
    assert (c.partitioner, c.how, c.checked) == (MURMUR2, "default: the topic held no keyed record at start", True)


def test_ambiguous_keys_alone_choose_murmur2():
    choices = decide_partitioners(fk_topology(), {"customers": 4, "orders": 4},
                                  _samples({"customers": placed(CONSISTENT, MC_AGREE)}))
    assert choices["customers"].partitioner is MURMUR2
    assert choices["customers"].how == f"detected from {len(MC_AGREE)} sampled keys"


def test_no_known_partitioner_explains_the_keys():
    k = DISTINCT[3]
    nowhere = ({0, 1, 2, 3} - {p.partition(k, 4) for p in KNOWN}).pop()
    samples = {"customers": [(x, CONSISTENT.partition(x, 4), 10 + i) for i, x in enumerate(DISTINCT[:3])]
               + [(k, nowhere, 99)]}
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(fk_topology(), {"customers": 4, "orders": 4}, samples)
    msg = str(err.value)
    assert msg.startswith(f"no known partitioner explains where the keys of topic customers are: key {k!r} "
                          f"at customers[{nowhere}]@99 (murmur2 -> {MURMUR2.partition(k, 4)}, "
                          f"consistent -> {CONSISTENT.partition(k, 4)}, fnv1a -> {FNV1A.partition(k, 4)})")
    assert err.value.exit_code == 2 and isinstance(err.value, ConfigError)


def test_keys_of_two_partitioners_in_one_topic_are_refused_with_a_partitioning_error():
    samples = _samples({"customers": placed(MURMUR2, DISTINCT[:5]) + placed(CONSISTENT, DISTINCT[5:10])})
    assert explaining([(k, p) for k, p, _ in samples["customers"]], 4) == []
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(fk_topology(), {"customers": 4, "orders": 4}, samples)
    assert "no known partitioner explains where the keys of topic customers are" in str(err.value)


@pytest.mark.parametrize("name,family", [("murmur2", MURMUR2), ("murmur2_random", MURMUR2),
                                         ("consistent", CONSISTENT), ("consistent_random", CONSISTENT),
                                         ("fnv1a", FNV1A), ("fnv1a_random", FNV1A)])
def test_declared_partitioner_agreeing_with_the_data(name, family):
    topo = fk_topology(right_partitioner=name)
    assert topo.declared_partitioners() == {"customers": name}
    samples = _samples({"customers": placed(family, DISTINCT)})
    c = decide_partitioners(topo, {"customers": 4, "orders": 4}, samples)["customers"]
    assert (c.partitioner, c.how, c.checked) == (family, "declared", True)
    # declared, on an empty topic: the declaration stands
    c = decide_partitioners(topo, {"customers": 4, "orders": 4}, {})["customers"]
    assert (c.partitioner, c.how) == (family, "declared")


def test_declared_partitioner_contradicted_by_a_sample_is_refused():
    topo = fk_topology(right_partitioner="murmur2")
    good = placed(MURMUR2, DISTINCT[:4])
    bad = DISTINCT[4]
    where = CONSISTENT.partition(bad, 4)
    samples = _samples({"customers": good + [(bad, where)]})
    off = [o for k, p, o in samples["customers"] if k == bad][0]
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"customers": 4, "orders": 4}, samples)
    assert str(err.value).startswith(
        f"key {bad!r} at customers[{where}]@{off} is in partition {where}, but partitioner murmur2 "
        f"(declared as 'murmur2') puts it in partition {MURMUR2.partition(bad, 4)}: joins over this topic "
        f"would be silently wrong; ")
    assert err.value.exit_code == 2


def test_declared_consistent_random_accepts_a_spread_empty_key():
    topo = fk_topology(right_partitioner="consistent_random")
    spread = ({0, 1, 2, 3} - {CONSISTENT.partition(b"", 4)}).pop()
    samples = _samples({"customers": placed(CONSISTENT, DISTINCT) + [(b"", spread)]})
    assert decide_partitioners(topo, {"customers": 4, "orders": 4}, samples)["customers"].partitioner is CONSISTENT


def test_detection_of_consistent_random_with_a_spread_empty_key():
    topo = fk_topology()
    spread = ({0, 1, 2, 3} - {CONSISTENT.partition(b"", 4)}).pop()
    samples = _samples({"customers": placed(CONSISTENT, DISTINCT) + [(b"", spread)]})
    c = decide_partitioners(topo, {"customers": 4, "orders": 4}, samples)["customers"]
    assert c.partitioner is CONSISTENT


def test_ambiguous_side_is_narrowed_by_its_co_partitioned_side():
    topo = pk_topology()
    assert [(lt, rt) for _, lt, rt in topo.copartition_constraints()] == [(["A"], ["B"]), (["B"], ["A"])]
    samples = _samples({"A": placed(CONSISTENT, MC_AGREE), "B": placed(CONSISTENT, DISTINCT)})
    choices = decide_partitioners(topo, {"A": 4, "B": 4}, samples)
    assert {t: c.partitioner for t, c in choices.items()} == {"A": CONSISTENT, "B": CONSISTENT}
    assert choices["A"].how == f"detected from {len(MC_AGREE)} sampled keys; narrowed by " \
                               f"{topo.copartition_constraints()[0][0]} to what B admits"
    assert choices["B"].how == f"detected from {len(DISTINCT)} sampled keys"
    # the same A alone (no constraint) would have been murmur2: the narrowing decided it
    alone = decide_partitioners(fk_topology(), {"customers": 4, "orders": 4},
                                {"customers": samples["A"]})
    assert alone["customers"].partitioner is MURMUR2
    # and an empty side follows the other
    choices = decide_partitioners(topo, {"A": 4, "B": 4}, {"A": [], "B": samples["B"]})
    assert {t: c.partitioner for t, c in choices.items()} == {"A": CONSISTENT, "B": CONSISTENT}
    assert choices["A"].how.startswith("default: the topic held no keyed record at start; narrowed by ")
    choices = decide_partitioners(topo, {"A": 4, "B": 4}, {"A": [], "B": _samples({"B": placed(FNV1A, DISTINCT)})["B"]})
    assert {t: c.partitioner for t, c in choices.items()} == {"A": FNV1A, "B": FNV1A}


def test_co_partitioned_sides_detected_as_different_partitioners_are_refused():
    topo = pk_topology(left="left-topic", right="right-topic")
    samples = _samples({"left-topic": placed(CONSISTENT, DISTINCT), "right-topic": placed(MURMUR2, DISTINCT)})
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"left-topic": 4, "right-topic": 4}, samples)
    msg = str(err.value)
    assert "left-topic (consistent, detected from 20 sampled keys)" in msg
    assert "right-topic (murmur2, detected from 20 sampled keys)" in msg
    assert "co-partitioned inputs must be placed by one partitioner" in msg
    assert err.value.exit_code == 2


def test_co_partitioned_declared_and_detected_disagreeing_are_refused():
    b = StreamsBuilder()
    s = b.stream("clicks", partitioner="fnv1a_random")
    t = b.table("users")
    s.join(t, lambda c, u: [c, u]).to("out")
    topo = b.build()
    assert topo.partitioning_relevant_topics() == ["clicks", "users"]
    samples = _samples({"clicks": placed(FNV1A, DISTINCT), "users": placed(CONSISTENT, DISTINCT)})
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"clicks": 4, "users": 4}, samples)
    msg = str(err.value)
    assert "clicks (fnv1a, declared)" in msg and "users (consistent, detected from 20 sampled keys)" in msg


def test_internal_repartition_source_forces_murmur2_on_the_co_partitioned_external_side():
    topo = pk_topology(repartition_left=True, left="A", right="C")
    internal = "KTABLE-SOURCE-0000000000-repartition"
    assert topo.partitioning_relevant_topics() == ["C"]
    assert [(lt, rt) for _, lt, rt in topo.copartition_constraints()] == [([internal], ["C"]), (["C"], [internal])]
    # C's keys do not tell murmur2 and consistent apart: the internal side decides murmur2
    choices = decide_partitioners(topo, {"A": 4, "C": 4}, _samples({"C": placed(CONSISTENT, MC_AGREE)}))
    assert sorted(choices) == ["C"]
    assert choices["C"].partitioner is MURMUR2
    # C detected as consistent: refused, naming the internal topic and C
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"A": 4, "C": 4}, _samples({"C": placed(CONSISTENT, DISTINCT)}))
    msg = str(err.value)
    assert f"{internal} (murmur2, internal topic)" in msg
    assert "C (consistent, detected from 20 sampled keys)" in msg
    # bound to an application: the internal topic carries the application id
    bound = topo.for_application("app")
    with pytest.raises(PartitioningError, match=f"app-{internal} \\(murmur2, internal topic\\)"):
        decide_partitioners(bound, {"A": 4, "C": 4}, _samples({"C": placed(CONSISTENT, DISTINCT)}))


def test_one_partition_topic_is_not_checked():
    topo = fk_topology()
    samples = _samples({"customers": [(k, 0) for k in DISTINCT]})
    c = decide_partitioners(topo, {"customers": 1, "orders": 4}, samples)["customers"]
    assert c.checked is False
    assert c.how == "one partition: every partitioner places keys alike"
    assert str(c) == f"{c.partitioner.name} (one partition: every partitioner places keys alike)"
    routing = Routing({"customers": c}, {"customers": 1})
    assert routing.checks(["customers"]) == {}
    # declared on one partition: not checked either
    c = decide_partitioners(fk_topology(right_partitioner="fnv1a"), {"customers": 1, "orders": 4}, samples)["customers"]
    assert (c.partitioner, c.how, c.checked) == (FNV1A, "declared", False)
    # a co-partitioned pair on one partition each: no conflict whatever the samples
    topo = pk_topology()
    choices = decide_partitioners(topo, {"A": 1, "B": 1}, _samples({"A": [(k, 0) for k in DISTINCT],
                                                                    "B": [(k, 0) for k in DISTINCT]}))
    assert {t: (c.checked, c.partitioner) for t, c in choices.items()} == {"A": (False, MURMUR2), "B": (False, MURMUR2)}


# -- review fixes: merges, self-joins, declarations, recorded routing -----------------------------

def test_a_merge_that_reaches_keyed_state_must_be_co_partitioned():
    b = StreamsBuilder()
    merged = b.stream("s1").merge(b.stream("s2"))
    merged.group_by_key().count(name="c").to_stream().to("out")
    merged.filter(lambda k, v: True).to("plain")
    topo = b.build()
    assert [(lt, rt) for _, lt, rt in topo.copartition_constraints()] == [(["s1"], ["s2"])]
    assert topo.partitioning_relevant_topics() == ["s1", "s2"]
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"s1": 4, "s2": 4}, _samples({"s1": placed(MURMUR2, DISTINCT),
                                                                "s2": placed(CONSISTENT, DISTINCT)}))
    assert "s1 (murmur2" in str(err.value) and "s2 (consistent" in str(err.value)
    # a merge that only filters and writes keeps no state by key: no constraint
    b = StreamsBuilder()
    b.stream("s1").merge(b.stream("s2")).filter(lambda k, v: True).to("plain")
    assert b.build().copartition_constraints() == []


def test_a_table_joined_with_itself_unoptimized_needs_no_check():
    b = StreamsBuilder()
    t = b.table("t")
    t.join(t, lambda x, y: [x, y]).to_stream().to("out")
    assert b.build(optimize=False).copartition_constraints() == []
    assert b.build(optimize=False).partitioning_relevant_topics() == []


def test_contradictory_declarations_and_declaration_with_repartition_are_refused_at_build():
    b = StreamsBuilder()
    b.table("A", partitioner="murmur2").join(b.table("B", partitioner="consistent_random"),
                                             lambda x, y: [x, y]).to_stream().to("out")
    with pytest.raises(TopologyError) as err:
        b.build()
    assert "A (murmur2)" in str(err.value) and "B (consistent)" in str(err.value)
    for source in ("table", "stream"):
        with pytest.raises(TopologyError) as err:
            getattr(StreamsBuilder(), source)("x", partitioner="murmur2", repartition=True)
        assert "not both" in str(err.value)


def test_recorded_routing_partitioner_is_kept_and_contradictions_name_the_reset():
    topo = fk_topology()
    samples = _samples({"customers": placed(CONSISTENT, DISTINCT)})
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(topo, {"customers": 4, "orders": 4}, samples, recorded={"customers": "murmur2"})
    msg = str(err.value)
    assert "partitioner murmur2 (recorded at the application's first start)" in msg
    assert "reset the application" in msg
    choice = decide_partitioners(topo, {"customers": 4, "orders": 4}, {"customers": []},
                                 recorded={"customers": "consistent"})["customers"]
    assert (choice.partitioner, choice.routes, choice.how) == (CONSISTENT, True,
                                                               "recorded at the application's first start")
    with pytest.raises(PartitioningError) as err:
        decide_partitioners(fk_topology(right_partitioner="murmur2"), {"customers": 4, "orders": 4}, {},
                            recorded={"customers": "consistent"})
    assert "declared with partitioner 'murmur2'" in str(err.value) and "partitioner consistent since" in str(err.value)


def test_the_worker_refuses_another_partitioner_for_its_producer():
    from processor.runtime.worker import Worker

    with pytest.raises(ConfigError) as err:
        Worker(fk_topology(), "127.0.0.1:1", "app", "/tmp/unused-state", producer_config={"partitioner": "consistent"})
    assert "murmur2_random" in str(err.value)
    Worker(fk_topology(), "127.0.0.1:1", "app", "/tmp/unused-state", producer_config={"partitioner": "murmur2"})
