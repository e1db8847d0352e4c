"""Wiping a worker's state directory between runs (issue 5, done-when 2): the next run restores
every task from the changelog topics, with its progress in the log (records restored, rate,
remaining), to databases equal to those before the wipe: every column family of every task,
byte for byte (stores, last-emitted columns, join bookkeeping, high-water marks, the commit
record, the checkpoint). It then has nothing to process."""

import logging
import re
import shutil

from processor.kafka import clients as kafka
from processor.runtime import changelog_reader
from processor.runtime.worker import Worker
from processor.state.rocksdb import RocksDBDatabase
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import produce_interleaved, reliability_scenario

N = 20_000
PARTS = 4


def snapshot(app_dir):
    """{task dir: {column family: [(key, value), ...]}} of every task database."""
    out = {}
    for d in sorted(app_dir.glob("task-*")):
        db = RocksDBDatabase(d)
        try:
            out[d.name] = {cf: list(db.store(cf).items()) for cf in sorted(db.column_families())}
        finally:
            db.close()
    return out


def test_wiped_state_dir_restores_identical_databases(kafka_bootstrap, unique, tmp_path, monkeypatch, caplog,
                                                       report):
    orders, customers, prefix, app = f"orders-{unique}", f"customers-{unique}", f"wipe-{unique}", f"wipe-{unique}"
    for k, v in {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": prefix}.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, f"{prefix}-enriched": PARTS,
                                          f"{prefix}-totals": PARTS})
    produce_interleaved(kafka_bootstrap, reliability_scenario(orders, customers, N, seed=3))

    def run():
        w = Worker(apps.reliability_topology(), kafka_bootstrap, app, tmp_path / "state",
                   commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        return w

    first = run()
    assert first.records_processed > N
    before = snapshot(tmp_path / "state" / app)
    assert len(before) == 3 * PARTS
    entries = sum(len(v) for cfs in before.values() for v in cfs.values())

    shutil.rmtree(tmp_path / "state")
    monkeypatch.setattr(changelog_reader, "PROGRESS_EVERY_S", 0.0)   # a progress line per batch read
    caplog.set_level(logging.INFO, logger="processor.restore")
    second = run()
    after = snapshot(tmp_path / "state" / app)

    assert second.records_processed == 0
    assert sorted(after) == sorted(before)
    for task in before:
        assert sorted(after[task]) == sorted(before[task]), task
        for cf in before[task]:
            assert after[task][cf] == before[task][cf], (task, cf)

    lines = [r.getMessage() for r in caplog.records if r.name == "processor.restore"]
    started = [ln for ln in lines if re.match(r"restoring \d+ task\(s\) from their changelogs: \d+ store records", ln)]
    progress = [ln for ln in lines
                if re.match(r"restoring: \d+ records restored, \d+ records/s, (\d+|\?) remaining", ln)]
    done = [ln for ln in lines if re.match(r"restored task \d+_\d+ from its changelogs: \d+ records", ln)]
    assert started and progress and len(done) == 3 * PARTS, lines[:20]
    total = int(re.search(r": (\d+) store records", started[0]).group(1))
    remaining = [int(m.group(1)) for ln in progress if (m := re.search(r", (\d+) remaining", ln))]
    assert remaining and remaining == sorted(remaining, reverse=True) and remaining[-1] == 0
    restored = sum(int(re.search(r": (\d+) records", ln).group(1)) for ln in done)
    assert restored == second.restored_records > total
    report(f"{N} input records, first run processed {first.records_processed} (incl. internal); "
           f"{len(before)} task databases, {entries} entries in all column families")
    report(f"after the wipe: {second.restored_records} changelog records restored ({total} store records + "
           f"task changelogs), {len(progress)} progress lines, e.g. {progress[len(progress) // 2]!r}; "
           f"every column family equal byte for byte; 0 records processed again")
