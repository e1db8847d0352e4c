"""The shared settings object (``processor.config.StreamsConfig``): each bad value refused when it
is made, naming the setting, the value and what is allowed; the isolation-level rule; every
host (worker, backfill, test driver, CLI, engine) taking the allowed values from it."""

import argparse

import pytest

from processor import StreamsBuilder
from processor.config import ISOLATION_LEVELS, ON_ERROR_POLICIES, PROCESSING_GUARANTEES, StreamsConfig
from processor.errors import ConfigError
from processor.kafka.client_config import ClientConfig


def _topology():
    b = StreamsBuilder()
    b.stream("in").to("out")
    return b.build()


@pytest.mark.parametrize("setting, value, named", [
    ("processing_guarantee", "exactly-once", "processing_guarantee must be one of at_least_once, exactly_once, "
                                             "not 'exactly-once'"),
    ("on_error", "ignore", "on_error must be one of dlq, skip, fail, not 'ignore'"),
    ("max_task_idle_ms", -2, "max_task_idle_ms must be an integer >= -1"),
    ("max_task_idle_ms", 1.5, "max_task_idle_ms must be an integer >= -1"),
    ("max_task_idle_ms", True, "max_task_idle_ms must be an integer >= -1"),
    ("commit_interval_ms", -1, "commit_interval_ms must be a number >= 0, not -1"),
    ("commit_interval_ms", "100", "commit_interval_ms must be a number >= 0, not '100'"),
    ("replication_factor", 0, "replication_factor must be an integer of at least 1"),
    ("topic_configs", {"changelog": {"cleanup.policy": "delete"}},
     "--changelog-topic-config cleanup.policy=delete: changelog topics need cleanup.policy=compact"),
    ("topic_configs", {"state": {}}, "internal topic kind must be one of"),
    ("num_standby_replicas", -1, "num_standby_replicas must be an integer >= 0, not -1"),
    ("application_server", "localhost", "application_server must be host:port (the address other workers and "
                                        "clients use to reach this worker's HTTP endpoint), not 'localhost'"),
    ("application_server", "h:0", "application_server must be host:port"),
    ("application_server", "h:65536", "application_server must be host:port"),
    ("application_server", "h:http", "application_server must be host:port"),
    ("application_server", ":8080", "application_server must be host:port"),
    ("application_server", "http://h:8080", "application_server must be host:port"),
    ("application_server", "my host:8080", "application_server must be host:port"),
    ("application_server", 8080, "application_server must be host:port"),
    ("clients", ClientConfig(consumer={"isolation.level": "committed"}),
     "consumer setting isolation.level must be one of read_uncommitted, read_committed, not 'committed'"),
])
def test_each_bad_value_is_refused_naming_it(setting, value, named):
    with pytest.raises(ConfigError) as exc:
        StreamsConfig(**{setting: value})
    assert named in str(exc.value)
    assert exc.value.exit_code == 2


def test_the_defaults_are_valid_and_it_travels_by_pickle():
    import pickle

    c = StreamsConfig()
    assert (c.processing_guarantee, c.on_error, c.commit_interval_ms, c.max_task_idle_ms) == \
        ("at_least_once", "dlq", 1000, 0)
    assert c.topic_configs == {} and c.replication_factor is None
    given = StreamsConfig(processing_guarantee="exactly_once", clients=ClientConfig(common={"a": "b"}),
                          topic_configs={"changelog": {"retention.ms": "1"}})
    assert pickle.loads(pickle.dumps(given)) == given      # (the backfill ships settings to executors)


@pytest.mark.parametrize("guarantee, consumer, want", [
    ("at_least_once", {}, "read_uncommitted"),
    ("exactly_once", {}, "read_committed"),
    ("exactly_once", {"isolation.level": "read_uncommitted"}, "read_uncommitted"),
    ("at_least_once", {"isolation.level": "read_committed"}, "read_committed"),
])
def test_isolation_level_rule(guarantee, consumer, want):
    c = StreamsConfig(processing_guarantee=guarantee, clients=ClientConfig(consumer=consumer))
    assert c.isolation_level == want
    # the backfill passes the consumer settings on with the level in them
    assert c.clients_at_isolation_level().for_kind("consumer")["isolation.level"] == want
    # a common setting is a consumer setting too
    common = StreamsConfig(processing_guarantee=guarantee, clients=ClientConfig(common=consumer))
    assert common.isolation_level == want


def test_of_layers_the_per_kind_keywords_over_the_client_settings():
    c = StreamsConfig.of(client_config=ClientConfig(common={"a": "1"}, consumer={"b": "2"}),
                         consumer_config={"b": "3"}, producer_config={"linger.ms": "5"},
                         processing_guarantee="exactly_once")
    assert c.clients.for_kind("consumer") == {"a": "1", "b": "3"}
    assert c.clients.for_kind("producer") == {"a": "1", "linger.ms": "5"}
    assert c.processing_guarantee == "exactly_once"
    given = StreamsConfig(on_error="skip")
    assert StreamsConfig.of(given, on_error="dlq") is given        # keywords at their defaults
    layered = StreamsConfig.of(given, consumer_config={"x": "y"})
    assert layered.on_error == "skip" and layered.clients.for_kind("consumer") == {"x": "y"}


def test_of_refuses_a_setting_given_twice():
    with pytest.raises(ConfigError, match="on_error given beside config=StreamsConfig"):
        StreamsConfig.of(StreamsConfig(), on_error="skip")
    with pytest.raises(ConfigError, match="client_config given beside config=StreamsConfig"):
        StreamsConfig.of(StreamsConfig(), client_config=ClientConfig())


def test_worker_refuses_a_bad_on_error_when_made(tmp_path):
    from processor.runtime.worker import Worker

    with pytest.raises(ConfigError, match="on_error must be one of dlq, skip, fail, not 'drop'"):
        Worker(_topology(), "127.0.0.1:1", "cfg-app", tmp_path, on_error="drop")
    w = Worker(_topology(), "127.0.0.1:1", "cfg-app", tmp_path,
               config=StreamsConfig(on_error="skip", processing_guarantee="exactly_once"))
    assert (w.on_error, w.processing_guarantee, w.isolation_level) == ("skip", "exactly_once", "read_committed")


def test_backfill_refuses_a_bad_on_error_before_anything_else(tmp_path):
    import backfill

    # no broker at that address and no Spark session: the settings are checked first
    with pytest.raises(ConfigError, match="on_error must be one of dlq, skip, fail, not 'drop'"):
        backfill.run(_topology(), "127.0.0.1:1", "cfg-app", state_dir=tmp_path, on_error="drop")


def test_test_driver_refuses_a_bad_on_error():
    from processor.testing import TopologyTestDriver

    with pytest.raises(ConfigError, match="on_error must be one of"):
        TopologyTestDriver(_topology(), on_error="drop")


def _choices(parser: argparse.ArgumentParser, command: str, flag: str):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return next(a for a in sub._actions if flag in a.option_strings).choices


@pytest.mark.parametrize("command", ["run", "backfill"])
def test_cli_choices_are_the_constants(command):
    from processor.cli import _parser

    p = _parser()
    assert tuple(_choices(p, command, "--on-error")) == ON_ERROR_POLICIES
    assert tuple(_choices(p, command, "--processing-guarantee")) == PROCESSING_GUARANTEES


def test_the_engine_takes_the_policies_from_the_settings():
    from processor.engine import task

    assert task.ERROR_POLICIES is ON_ERROR_POLICIES
    assert ISOLATION_LEVELS == ("read_uncommitted", "read_committed")


def test_exactly_once_transaction_timeout_outlasts_the_commit_interval(tmp_path):
    """Exactly once: a transaction a dead worker left open holds read_committed readers back for
    transaction.timeout.ms; Kafka Streams' 10 s unless given, never below the commit interval."""
    from processor.runtime.worker import Worker

    assert StreamsConfig(processing_guarantee="exactly_once").transaction_timeout_ms == 10_000
    given = StreamsConfig.of(processing_guarantee="exactly_once", producer_config={"transaction.timeout.ms": 30000})
    assert given.transaction_timeout_ms == 30_000
    with pytest.raises(ConfigError, match=r"transaction.timeout.ms \(10000\) is below commit_interval_ms \(20000\)"):
        StreamsConfig.of(processing_guarantee="exactly_once", commit_interval_ms=20_000,
                         producer_config={"transaction.timeout.ms": 10000})
    with pytest.raises(ConfigError, match=r"transaction.timeout.ms \(10000\) is below commit_interval_ms \(90000\)"):
        StreamsConfig(processing_guarantee="exactly_once", commit_interval_ms=90_000)
    StreamsConfig(processing_guarantee="at_least_once", commit_interval_ms=90_000)   # no transactions
    with pytest.raises(ConfigError, match="transaction.timeout.ms must be an integer, not 'soon'"):
        StreamsConfig.of(processing_guarantee="exactly_once", producer_config={"transaction.timeout.ms": "soon"})
    b = StreamsBuilder()
    b.stream("in").to("out")
    w = Worker(b.build(), "127.0.0.1:1", "app", tmp_path, processing_guarantee="exactly_once",
               producer_config={"transaction.timeout.ms": 15000})
    assert w.config.transaction_timeout_ms == 15_000
