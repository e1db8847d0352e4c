"""Internal topics on the broker (processor/kafka/internal_topics.py): created with the
replication factor and the per-kind settings asked for; an existing one with the wrong partition
count or cleanup policy refused by name (exit 2), never used."""

import pytest

from processor import StreamsBuilder
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.kafka import internal_topics
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.test_operational_errors import FAST_GROUP, assert_exit, run_args, run_worker


def fk_and_repartition(orders, customers):
    """A foreign-key join (subscription and response topics), an aggregation through a
    repartition topic, and their changelogs."""
    b = StreamsBuilder()
    o = b.table(orders, store_name="orders")
    c = b.table(customers, store_name="customers")
    o.join_on_foreign_key(c, lambda v: v["c"], lambda left, right: {"n": left["n"], "tier": right["tier"]},
                          name="enriched")
    o.group_by(lambda k, v: (v["c"], v["n"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="n-by-customer")
    return b.build()


def _topics(unique, parts=2):
    return f"it-orders-{unique}", f"it-customers-{unique}", parts


def test_created_with_the_kinds_settings_and_checked_in_one_request(kafka_bootstrap, unique, tmp_path, report):
    orders, customers, parts = _topics(unique)
    kafka.create_topics(kafka_bootstrap, {orders: parts, customers: parts})
    app = f"it-app-{unique}"
    w = Worker(fk_and_repartition(orders, customers), kafka_bootstrap, app, tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG, replication_factor=1,
               topic_configs={"changelog": {"min.compaction.lag.ms": "100"},
                              "repartition": {"retention.ms": "3600000"},
                              "foreign-key": {"retention.ms": "7200000"}})
    w.check_topics()
    wanted = internal_topics.wanted_topics(w.topology, {orders: parts, customers: parts})
    kinds = {}
    for t, (_n, kind) in wanted.items():
        kinds.setdefault(kind, []).append(t)
    assert sorted(kinds) == ["changelog", "foreign-key", "repartition"], kinds
    assert len(kinds["foreign-key"]) == 2 and len(kinds["repartition"]) == 1
    described = internal_topics.describe(kafka_bootstrap, sorted(wanted))
    for t in kinds["changelog"]:
        assert described[t]["cleanup.policy"] == "compact" and described[t]["min.compaction.lag.ms"] == "100", t
    for t in kinds["repartition"]:
        assert described[t]["cleanup.policy"] == "delete" and described[t]["retention.ms"] == "3600000", t
    for t in kinds["foreign-key"]:
        assert described[t]["cleanup.policy"] == "delete" and described[t]["retention.ms"] == "7200000", t
    counts = kafka.topic_partitions(kafka_bootstrap)
    assert {t: counts[t] for t in wanted} == {t: n for t, (n, _) in wanted.items()}
    # a second start finds them all as they should be: nothing created, nothing refused
    again = Worker(fk_and_repartition(orders, customers), kafka_bootstrap, app, tmp_path / "again",
                   consumer_config=TEST_CONSUMER_CONFIG)
    assert internal_topics.ensure(kafka_bootstrap, app, internal_topics.wanted_topics(again.topology, counts),
                                  counts) == []
    assert internal_topics.default_replication_factor(kafka_bootstrap) == 1   # min(3, one broker)
    report(f"{len(wanted)} internal topics ({', '.join(f'{k}: {len(v)}' for k, v in sorted(kinds.items()))}) "
           f"created with their kind's settings; a second start checks them in one describe request")


@pytest.mark.parametrize("case", ["changelog-not-compacted", "repartition-compacted", "fk-partitions"])
def test_an_existing_internal_topic_that_differs_is_refused_by_name(kafka_bootstrap, unique, tmp_path, case):
    orders, customers, parts = _topics(unique)
    kafka.create_topics(kafka_bootstrap, {orders: parts, customers: parts})
    app = f"it-bad-{unique}"
    topo = fk_and_repartition(orders, customers).for_application(app)
    wanted = internal_topics.wanted_topics(topo, {orders: parts, customers: parts})
    pick = {"changelog-not-compacted": "changelog", "repartition-compacted": "repartition",
            "fk-partitions": "foreign-key"}[case]
    topic = sorted(t for t, (_, kind) in wanted.items() if kind == pick)[0]
    if case == "changelog-not-compacted":
        kafka.create_topics(kafka_bootstrap, {topic: parts}, config=kafka.TOPIC_CONFIG)
        fragments = [f"changelog topic {topic} has cleanup.policy=delete", "needs cleanup.policy=compact"]
    elif case == "repartition-compacted":
        kafka.create_topics(kafka_bootstrap, {topic: parts}, config=kafka.CHANGELOG_TOPIC_CONFIG)
        fragments = [f"repartition topic {topic} has cleanup.policy=compact", "cleanup.policy=delete"]
    else:
        kafka.create_topics(kafka_bootstrap, {topic: parts + 1})
        fragments = [f"foreign-key topic {topic} has {parts + 1} partitions", f"needs {parts}"]
    w = Worker(fk_and_repartition(orders, customers), kafka_bootstrap, app, tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(ConfigError) as info:
        w.check_topics()
    assert all(f in str(info.value) for f in fragments), str(info.value)
    # nothing else was created next to the refused topic
    counts = kafka.topic_partitions(kafka_bootstrap)
    assert [t for t in wanted if t in counts] == [topic]


def test_the_command_refuses_with_exit_2_and_one_line(kafka_bootstrap, unique, tmp_path, monkeypatch):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    [changelog] = [t for t in apps.filter_topology().for_application(app).changelog_topic_partitions({inp: 1})
                   if "_bookkeeping" not in t and "__task" not in t]    # the table's store
    kafka.create_topics(kafka_bootstrap, {changelog: 1}, config={"retention.ms": "-1"})   # policy: broker default
    p = run_worker(run_args("filter_topology", kafka_bootstrap, app, tmp_path, *FAST_GROUP),
                   {"APP_INPUT": inp, "APP_OUTPUT": out})
    assert_exit(p, 2, f"changelog topic {changelog} has cleanup.policy=delete", "reset the application")


def test_topic_settings_that_break_a_kind_are_refused():
    with pytest.raises(ConfigError, match="changelog topics need cleanup.policy=compact"):
        internal_topics.check_kind_configs({"changelog": {"cleanup.policy": "delete"}})
    with pytest.raises(ConfigError, match="repartition topics need cleanup.policy=delete"):
        internal_topics.check_kind_configs({"repartition": {"cleanup.policy": "compact,delete"}})
    assert internal_topics.check_kind_configs({"changelog": {"cleanup.policy": "compact,delete"}})
