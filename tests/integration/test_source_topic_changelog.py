"""A table whose source topic is its changelog (``build(reuse_source_topics=True)``): the worker
writes no changelog for the table's store, and a worker that lost its state directory restores
the store from the source topic up to its committed position, putting back the row each record
the task rejected found. Checked against a worker of the same topology with a changelog, run
over the same input without losing anything: the table stores byte for byte (timestamps
included), the outputs per key as exact sequences (both against the test driver), the dead
letters as the same records (their order across input partitions is the interleaving's).
Switching the option on and off for an application that ran is checked the same way."""

import json
import shutil

import pytest
from confluent_kafka import Producer

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.state import source_changelog
from processor.state.rocksdb import RocksDBDatabase
from processor.state.store import TASK_STORE
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import by_key, driver_output_by_key, produce, table_updates, task_store_bytes

STORE = "{inp}-STATE-STORE-0000000000"


def _amount(a) -> bytes:
    return json.dumps({"amount": a}, separators=(",", ":")).encode()


def _run(bootstrap, app_id, reuse, state_dir, guarantee="at_least_once"):
    """One worker of ``apps.filter_topology`` until drained (topics from the environment)."""
    w = Worker(apps.filter_topology(reuse_source_topics=reuse), bootstrap, app_id, state_dir,
               consumer_config=TEST_CONSUMER_CONFIG, processing_guarantee=guarantee)
    w.run(until_drained=True, install_signal_handlers=False)
    return w


def _table(app_dir, store):
    """The store's contents over every task database of an application's state directory."""
    return task_store_bytes(sorted(app_dir.glob("task-*")), [store])[store]


def _first_half() -> list:
    """Table updates with records the task rejects between them: a value that is not JSON (the
    source fails) and values without "amount" (the filter fails after the table source wrote;
    the write is undone), for keys with a row and without one. Key ``same`` gets A, a rejected
    B, then A again: its row must keep A's first timestamp (the second A is a no-op), which a
    restore that applied B would lose."""
    records = table_updates(1_500, keys=150, seed=7)
    records[100:100] = [(b"same", _amount(150)), (b"same", b'{"x":1}'), (b"same", _amount(150))]
    records[400:400] = [(b"k00001", b"{not json"), (b"k00002", b'{"x":2}')]
    # rejected records of keys that have no row (a restore must not give them one)
    records[700:700] = [(b"fresh-1", b"{not json"), (b"fresh-2", b'{"x":3}')]
    return records


def _one_table_app(bootstrap, unique, monkeypatch):
    """Topics ``orders-…`` and ``big-…`` (2 partitions each) for the application of the reuse
    toggling tests, named to it through the environment; returns its input topic, its application
    id, a reference application id and its store's name."""
    inp, out, app, ref_app = f"orders-{unique}", f"big-{unique}", f"app-{unique}", f"ref-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(bootstrap, {inp: 2, out: 2})
    return inp, app, ref_app, STORE.format(inp=inp)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_restore_from_source_topic_equals_a_changelog_run(kafka_bootstrap, unique, tmp_path, monkeypatch, guarantee):
    inp, reuse_out, ref_out = f"orders-{unique}", f"big-{unique}", f"big-ref-{unique}"
    reuse_app, ref_app = f"reuse-{unique}", f"ref-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    kafka.create_topics(kafka_bootstrap, {inp: 2, reuse_out: 2, ref_out: 2})
    first = _first_half()
    second = table_updates(1_500, keys=150, seed=8)

    def run(app, reuse, state, out):
        monkeypatch.setenv("APP_OUTPUT", out)
        return _run(kafka_bootstrap, app, reuse, tmp_path / state, guarantee)

    produce(kafka_bootstrap, inp, first)
    assert run(reuse_app, True, "reuse", reuse_out).records_processed == len(first)
    topics = kafka.topic_partitions(kafka_bootstrap)
    changelogs = sorted(t for t in topics if t.startswith(f"{reuse_app}-") and t.endswith("-changelog"))
    assert changelogs == [f"{reuse_app}-__task-0-changelog", f"{reuse_app}-_bookkeeping-0-changelog"]
    task_changelog_records = sum(len(kafka.read_topic(kafka_bootstrap, t)) for t in changelogs)
    shutil.rmtree(tmp_path / "reuse")

    produce(kafka_bootstrap, inp, second, timestamp0=5_000_000)
    again = run(reuse_app, True, "reuse", reuse_out)
    assert again.records_processed == len(second)
    # every record of the first half was read again (the rejected ones too, then skipped)
    assert again.restored_records == len(first) + task_changelog_records
    ref = run(ref_app, False, "ref", ref_out)
    assert ref.records_processed == len(first) + len(second)

    store = STORE.format(inp=inp)
    got = _table(tmp_path / "reuse" / reuse_app, store)
    want = _table(tmp_path / "ref" / ref_app, store)
    assert len(want) > 100 and got == want and b"fresh-1" not in got and b"fresh-2" not in got
    # key "same": A, a rejected B, A again: the row keeps the first A's timestamp
    assert want[b"same"] == (1_000_000 + 100).to_bytes(8, "big") + _amount(150)

    inputs = kafka.read_topic(kafka_bootstrap, inp)
    monkeypatch.setenv("APP_OUTPUT", reuse_out)
    driver = driver_output_by_key(lambda: apps.filter_topology(reuse_source_topics=True), inp, reuse_out, inputs)
    assert by_key(kafka.read_topic(kafka_bootstrap, reuse_out)) == driver
    monkeypatch.setenv("APP_OUTPUT", ref_out)
    assert by_key(kafka.read_topic(kafka_bootstrap, ref_out)) == \
        driver_output_by_key(apps.filter_topology, inp, ref_out, inputs)
    rejected = [(b"same", b'{"x":1}'), (b"k00001", b"{not json"), (b"k00002", b'{"x":2}'),
                (b"fresh-1", b"{not json"), (b"fresh-2", b'{"x":3}')]
    for app in (reuse_app, ref_app):
        dead = [(m.key(), m.value()) for m in kafka.read_topic(kafka_bootstrap, f"{app}-dlq")]
        assert sorted(dead) == sorted(rejected)


@pytest.mark.parametrize("history", ["state-kept", "state-lost", "off-on-off"])
def test_turning_reuse_off_writes_the_whole_table_to_its_new_changelog(kafka_bootstrap, unique, tmp_path,
                                                                      monkeypatch, history):
    """The same application without ``reuse_source_topics``: its table now has a changelog, which
    the last commit names no end for. The reopened task brings the store up to the last commit
    from the source topic where its local state is behind it (``state-lost``: all of it) and
    writes the whole store to the changelog, so a later restore from the changelog alone (state
    directory lost) rebuilds it; ``off-on-off``: a changelog from before the option was turned on
    (its stale end in the local checkpoint) is overwritten the same way. Each time the table
    equals, byte for byte, that of an application that always had a changelog."""
    inp, app, ref_app, store = _one_table_app(kafka_bootstrap, unique, monkeypatch)
    changelog = f"{app}-{store}-changelog"

    def run(app_id, reuse, state="state"):
        return _run(kafka_bootstrap, app_id, reuse, tmp_path / state)

    def table(state="state", app_id=app):
        return _table(tmp_path / state / app_id, store)

    produce(kafka_bootstrap, inp, _first_half())
    if history == "off-on-off":
        assert run(app, False).records_processed == 1_507
        produce(kafka_bootstrap, inp, table_updates(600, keys=150, seed=12), timestamp0=2_000_000)
        assert run(app, True).records_processed == 600
    else:
        assert run(app, True).records_processed == 1_507
        assert changelog not in kafka.topic_partitions(kafka_bootstrap)
    total = len(kafka.read_topic(kafka_bootstrap, inp))
    assert run(ref_app, False, "ref").records_processed == total
    want = table("ref", ref_app)
    assert len(want) > 100 and table() == want
    if history == "state-lost":
        shutil.rmtree(tmp_path / "state")
    off = run(app, False)
    assert off.records_processed == 0
    if history == "state-lost":
        assert off.restored_records >= 1_505
    assert table() == want
    logged = {}
    for m in kafka.read_topic(kafka_bootstrap, changelog):
        logged[m.key()] = m.value()
    assert {k: v for k, v in logged.items() if v is not None} == want
    shutil.rmtree(tmp_path / "state")
    again = run(app, False)
    assert again.records_processed == 0 and again.restored_records >= len(want)
    assert table() == want


def test_a_source_topic_that_may_delete_records_is_named_in_a_warning(kafka_bootstrap, unique, caplog, broker_kind):
    from processor.kafka import internal_topics

    plain, compact, forever = f"plain-{unique}", f"compact-{unique}", f"forever-{unique}"
    bounded = f"bounded-{unique}"
    kafka.create_topics(kafka_bootstrap, {plain: 1}, config={"max.message.bytes": "1000000"})
    kafka.create_topics(kafka_bootstrap, {bounded: 1},
                        config={"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "1000000"})
    kafka.create_topics(kafka_bootstrap, {compact: 1}, config={"cleanup.policy": "compact"})
    kafka.create_topics(kafka_bootstrap, {forever: 1}, config={"cleanup.policy": "delete", "retention.ms": "-1"})
    with caplog.at_level("WARNING", logger="processor.topics"):
        risky = internal_topics.warn_deleting_sources(kafka_bootstrap, [bounded, compact, forever, plain])
    assert risky == [bounded, plain]
    assert [r.getMessage().split(" ")[1] for r in caplog.records] == [bounded, plain]
    # a topic created without them: Tansu reports no settings it was not given, Apache Kafka its defaults
    if broker_kind == "tansu":
        assert "cleanup.policy=(not reported)" in caplog.records[1].getMessage()
    else:
        assert "cleanup.policy=delete and retention.ms=604800000" in caplog.records[1].getMessage()


def test_turning_reuse_on_keeps_the_former_changelog_as_the_base(kafka_bootstrap, unique, tmp_path, monkeypatch):
    """An application that ran without ``reuse_source_topics`` rejected records the task never
    recorded (key ``same``: A, a rejected B, A). Turned on, the task keeps the last commit's
    changelog end and source position as its store's base: a restore into an empty directory
    reads the former changelog up to there and the topic only from there on, and ends equal,
    byte for byte, to a run that never lost its state."""
    inp, app, ref_app, store = _one_table_app(kafka_bootstrap, unique, monkeypatch)

    def run(app_id, reuse, state):
        return _run(kafka_bootstrap, app_id, reuse, tmp_path / state)

    def table(state, app_id):
        return _table(tmp_path / state / app_id, store)

    produce(kafka_bootstrap, inp, _first_half())
    assert run(app, False, "state").records_processed == 1_507           # without: a changelog
    # a record past the last commit in the changelog (what a unit that never committed leaves):
    # its key's row at the switch is kept beside the base (compaction could drop the row below)
    part = next(m.partition() for m in kafka.read_topic(kafka_bootstrap, inp) if m.key() == b"k00003")
    changelog = f"{app}-{store}-changelog"
    p = Producer(kafka.producer_defaults(kafka_bootstrap))
    p.produce(changelog, b"\x00" * 8 + b'{"amount":-1}', b"k00003", partition=part)
    p.flush()
    produce(kafka_bootstrap, inp, table_updates(500, keys=150, seed=9), timestamp0=3_000_000)
    assert run(app, True, "state").records_processed == 500              # turned on
    task_dir = tmp_path / "state" / app / f"task-0_{part}"
    db = RocksDBDatabase(task_dir)
    try:
        overlay = source_changelog.base_rows(db.store(TASK_STORE), store)
        base = source_changelog.read_base(db.store(TASK_STORE), store)
    finally:
        db.close()
    assert [k for k, _ in overlay] == [b"k00003"] and base[0] == changelog
    assert overlay[0][1] is None or overlay[0][1].endswith(b"}") and b"-1" not in overlay[0][1]
    produce(kafka_bootstrap, inp, table_updates(500, keys=150, seed=10), timestamp0=4_000_000)
    shutil.rmtree(tmp_path / "state")
    again = run(app, True, "state")                                       # state lost
    assert again.records_processed == 500
    assert run(ref_app, False, "ref").records_processed == 2_507
    want = table("ref", ref_app)
    assert len(want) > 100 and table("state", app) == want
    assert want[b"same"] == (1_000_000 + 100).to_bytes(8, "big") + _amount(150)


def test_turning_reuse_off_on_an_older_state_directory_goes_through_the_base(kafka_bootstrap, unique, tmp_path,
                                                                            monkeypatch):
    """State directory A ran first without the option; B went on without it (rejecting records
    no entry names), then with it (its base: B's last commit before); A, behind all of that,
    runs again without it. A's store must come up to the base from the changelog and only then
    from the topic: the rejected records of B's first period are not in any entry."""
    inp, app, ref_app, store = _one_table_app(kafka_bootstrap, unique, monkeypatch)

    def run(app_id, reuse, state):
        return _run(kafka_bootstrap, app_id, reuse, tmp_path / state)

    produce(kafka_bootstrap, inp, table_updates(500, keys=150, seed=13))
    assert run(app, False, "A").records_processed == 500
    produce(kafka_bootstrap, inp, _first_half(), timestamp0=2_000_000)       # with rejected records
    assert run(app, False, "B").records_processed == 1_507
    produce(kafka_bootstrap, inp, table_updates(500, keys=150, seed=14), timestamp0=3_000_000)
    assert run(app, True, "B").records_processed == 500
    produce(kafka_bootstrap, inp, table_updates(300, keys=150, seed=15), timestamp0=4_000_000)
    assert run(app, False, "A").records_processed == 300
    assert run(ref_app, False, "ref").records_processed == 2_807
    want = _table(tmp_path / "ref" / ref_app, store)
    got = _table(tmp_path / "A" / app, store)
    assert len(want) > 100 and got == want
    assert want[b"same"] == (2_000_000 + 100).to_bytes(8, "big") + _amount(150)
