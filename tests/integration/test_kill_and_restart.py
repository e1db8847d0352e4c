"""Kill test on a real broker (issue 5, done-when 1): two worker PROCESSES run a topology with a
foreign-key join (orders -> customers, left) and a grouped aggregation (totals per customer,
through a repartition topic) while 50,000 interleaved records arrive; five times, at random
moments, one of them is SIGKILLed and restarted on its state directory at once. Per processing
guarantee:

1. every materialized table (the two source tables, the join result, the aggregate and its
   last-emitted column) in the last owner's RocksDB equals, byte for byte, what the broker-free
   driver computes for the same input (for the join result: the value bytes; its timestamp is
   max(left, right) at resolution, which depends on how partitions interleave, as in Kafka
   Streams; the number of such differences is reported);
2. the worker's restore, run into EMPTY databases, rebuilds every task from the changelogs alone
   to stores and checkpoints equal, byte for byte (internal stores included), to the live ones;
3. outputs: duplicate output records (an unchanged result emitted again, a tombstone for a key
   without a result: what a replay after a crash causes) and keys whose final output differs
   from the driver's are counted and reported. The aggregate's output must converge under both
   guarantees. The join's output may not under at-least-once: a killed unit's outputs that the
   replay (reading the task's two input topics in another interleaving) does not reproduce are
   never retracted. With exactly_once both must be zero where the broker hides aborted
   transactions and fences zombies (probed at start-up); Tansu does neither, so there they are
   reported, not asserted.
"""

import json
import os
import random
import signal
import threading
import time

import pytest

from processor.kafka import clients as kafka
from processor.runtime.changelog_reader import ChangelogReader, RestoreTarget
from processor.serde import Serdes
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.integration import apps
from tests.integration.helpers import (
    driver_store_bytes,
    final_table,
    final_table_values,
    kill_leftover_workers,
    latest_task_dirs,
    order_totals,
    pipe_messages,
    produce_interleaved,
    reliability_scenario,
    start_worker_process,
    start_workers,
    table_emission_violations,
    task_store_bytes,
    wait_until_tasks_committed,
    wait_until_workers_assigned,
    worker_isolation_level,
)

N = 50_000
PARTS = 4
KILLS = 5
SPEC = "tests.integration.apps:reliability_topology"
TABLES = ("orders-store", "customers-store", "enriched", "totals", "totals.emitted")
ALL_STORES = TABLES + ("enriched-version-store", "enriched-subscription-store", "_bookkeeping", "__task")


def _sequences(messages):
    seqs = {}
    for m in messages:
        seqs.setdefault(m.key(), []).append(m.value())
    return seqs


@pytest.mark.parametrize("guarantee,reuse", [("at_least_once", False), ("exactly_once", False),
                                             ("at_least_once", True), ("exactly_once", True)],
                         ids=["at_least_once", "exactly_once", "at_least_once-source-topics-as-changelogs",
                              "exactly_once-source-topics-as-changelogs"])
def test_five_sigkills_two_workers_tables_equal_driver(kafka_bootstrap, unique, tmp_path, monkeypatch, report,
                                                        broker_capabilities, guarantee, reuse):
    orders, customers, prefix, app = f"orders-{unique}", f"customers-{unique}", f"rel-{unique}", f"rel-{unique}"
    outs = {"enriched": f"{prefix}-enriched", "totals": f"{prefix}-totals"}
    env = {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": prefix,
           "APP_REUSE_SOURCE_TOPICS": "1" if reuse else "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, **{t: PARTS for t in outs.values()}})
    records = reliability_scenario(orders, customers, N)
    rnd = random.Random(int(os.environ.get("KILL_TEST_SEED", 11)))   # other kill moments: by hand
    caps = broker_capabilities
    # Where the broker may leave a committed transaction unfinished after a producer is fenced
    # (probe transactions_complete_after_fencing; Tansu), its last stable offset can stay in
    # front of committed records and its group offsets may never be written: read_committed
    # would block there, and hides nothing on such a broker anyway (read_committed_hides_aborted).
    # So on it the workers and this test read uncommitted, and "drained" is judged by the
    # workers' commit records instead of the group offsets.
    iso = worker_isolation_level(guarantee, caps)
    worker_conf = [f"isolation.level={iso}"]

    state, logs, procs = start_workers(kafka_bootstrap, SPEC, app, tmp_path, env, guarantee, worker_conf)
    kills = []
    try:
        wait_until_workers_assigned(procs, logs, lambda: [open(lg).read()[-2000:] for lg in logs])
        produced = {}
        producer = threading.Thread(target=lambda: produced.update(
            produce_interleaved(kafka_bootstrap, records, chunk=500, pause_s=0.1)))
        t0 = time.monotonic()
        producer.start()
        # five kills at random moments while the input arrives and shortly after
        moments = sorted(rnd.uniform(1.0, 16.0) for _ in range(KILLS))
        for at in moments:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            i = rnd.randrange(2)
            procs[i].send_signal(signal.SIGKILL)
            rc = procs[i].wait(30)
            assert rc == -signal.SIGKILL, open(logs[i]).read()[-3000:]
            kills.append((round(time.monotonic() - t0, 1), f"w{i}"))
            procs[i] = start_worker_process(kafka_bootstrap, SPEC, app, state[i], logs[i], env, guarantee,
                                 consumer_config=worker_conf)
        producer.join(120)
        assert not producer.is_alive()
        produce_s = time.monotonic() - t0
        internal = [f"{app}-totals-repartition", f"{app}-enriched-subscription-registration-topic",
                    f"{app}-enriched-subscription-response-topic"]
        def worker_logs():
            return "\n".join(f"--- w{i} (kills so far {kills}, exit code {p.poll()}):\n" + open(lg).read()[-4000:]
                             for i, (p, lg) in enumerate(zip(procs, logs, strict=False)))

        def workers_alive():
            if any(p.poll() is not None for p in procs):
                pytest.fail(f"a worker exited on its own\n{worker_logs()}")

        topo = apps.reliability_topology().for_application(app)
        try:
            wait_until_tasks_committed(kafka_bootstrap, topo, {t: PARTS for t in [orders, customers] + internal},
                                       iso, timeout_s=240, check=workers_alive)
        except AssertionError as e:   # the timeout: with the workers' logs
            raise AssertionError(f"{e}\n{worker_logs()}") from None
        drained_s = time.monotonic() - t0
        for p in procs:
            assert p.poll() is None, "a worker died on its own"
            p.send_signal(signal.SIGTERM)
        for i, p in enumerate(procs):
            assert p.wait(60) == 0, open(logs[i]).read()[-3000:]
    finally:
        kill_leftover_workers(procs)
    assert len(kills) == KILLS
    log_text = "".join(open(lg).read() for lg in logs)
    restores = log_text.count("restored task ")
    tails = log_text.count("of an unfinished commit will be overwritten")

    # the driver, fed the input as read back (topic by topic, partition then offset)
    left_msgs, right_msgs = kafka.read_topic(kafka_bootstrap, orders), kafka.read_topic(kafka_bootstrap, customers)
    assert len(left_msgs) + len(right_msgs) == N
    driver = TopologyTestDriver(apps.reliability_topology())
    with driver:
        pipe_messages(driver, left_msgs + right_msgs)
        want = driver_store_bytes(driver, TABLES)
        want_recs = {j: driver.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes())
                     for j, t in outs.items()}
    want_out = {j: final_table_values(r) for j, r in want_recs.items()}
    want_seqs = {j: _sequences_of_records(r) for j, r in want_recs.items()}

    # 1. the live stores (each task's last owner) vs the driver
    live_dirs = latest_task_dirs([s / app for s in state])
    assert len(live_dirs) == 3 * PARTS
    live = task_store_bytes(live_dirs.values(), TABLES)
    live_by_task = task_store_bytes(live_dirs.values(), ALL_STORES, by_task=True)
    live_checkpoints = {}
    for name, d in live_dirs.items():
        db = RocksDBDatabase(d)
        live_checkpoints[name] = db.read_checkpoint()
        db.close()
    ts_differences = 0
    for s in TABLES:
        if s == "enriched":
            assert {k: v[8:] for k, v in live[s].items()} == {k: v[8:] for k, v in want[s].items()}, s
            ts_differences = sum(live[s][k][:8] != want[s][k][:8] for k in want[s])
        else:
            assert live[s] == want[s], (s, len(live[s]), len(want[s]))
    totals = {k.decode(): json.loads(v[8:]) for k, v in live["totals"].items()}
    python_totals = order_totals(left_msgs)
    assert {k: t for k, t in totals.items() if t["orders"]} == python_totals

    # 2. restore from the changelogs alone, into empty databases (the worker's restore code)
    targets = [RestoreTarget(RocksDBDatabase(tmp_path / "fresh" / f"task-{sub}_{p}"), f"{sub}_{p}", p,
                             topo.changelogs_of(sub), topo.source_changelogs_of(sub))
               for sub in range(3) for p in range(PARTS)]
    assert bool(topo.source_changelogs_of(0)) == reuse
    conf = kafka.consumer_defaults(kafka_bootstrap)
    conf.update({"group.id": f"{app}-check", "isolation.level": iso})
    reader = ChangelogReader(conf)
    try:
        reader.restore(targets)
    finally:
        reader.close()
    fresh_records = sum(t.restored for t in targets)
    for t in targets:
        assert t.db.read_checkpoint() == live_checkpoints[f"task-{t.task_id}"], t.task_id
        t.db.close()
    restored = task_store_bytes(sorted((tmp_path / "fresh").glob("task-*")), ALL_STORES, by_task=True)
    bookkeeping_differences = 0
    for s in ALL_STORES:
        if s == "__task":   # host-local: the outbox and the commit record (units differ in number only)
            continue
        if s == "_bookkeeping" and guarantee == "exactly_once" and not caps.read_committed_hides_aborted:
            # a broker that shows aborted transactions (Tansu) hands a restore the high-water marks
            # of aborted units; compared under at_least_once, reported here
            bookkeeping_differences = sum(restored[s].get(k) != v for k, v in live_by_task[s].items()) + \
                len(set(restored[s]) - set(live_by_task[s]))
            continue
        assert restored[s] == live_by_task[s], s

    # 3. outputs: duplicates, and keys whose final output differs from the driver's
    dup, off = {}, {}
    for j, t in outs.items():
        msgs = kafka.read_topic(kafka_bootstrap, t, isolation_level=iso)
        seqs = _sequences(msgs)
        got = final_table(msgs)
        off[j] = sorted(k for k in set(got) | set(want_out[j]) if got.get(k) != want_out[j].get(k))
        dup[j] = sum(len(table_emission_violations(seq)) for seq in seqs.values())
        dup[f"{j} records"] = len(msgs)
        # records repeating an earlier record of their key: every replayed output is one, and so
        # is a legitimate return to an earlier value (the driver's own count of those is given)
        dup[f"{j} repeats"] = sum(len(seq) - len(set(seq)) for seq in seqs.values())
        dup[f"{j} driver repeats"] = sum(len(v) - len(set(v)) for v in want_seqs[j].values())
        dup[f"{j} driver records"] = sum(map(len, want_seqs[j].values()))
    label = guarantee + (" (source topics as the tables' changelogs)" if reuse else "")
    report(f"{label}: {N} input records ({len(left_msgs)} orders, {len(right_msgs)} customers), 2 worker "
           f"processes, SIGKILLs at {kills}; input produced in {produce_s:.1f} s, drained (commit records at the "
           f"end of every input and internal partition; workers read {iso}) after "
           f"{drained_s:.1f} s; {restores} task restores logged, {tails} with an unfinished-commit tail")
    report(f"{label}: stores equal the driver byte for byte: {', '.join(TABLES)} "
           f"({sum(len(live[s]) for s in TABLES)} entries); join-result timestamps that differ "
           f"(interleaving): {ts_differences}; restored from the changelogs into empty databases: "
           f"{fresh_records} records, every store and checkpoint equal to the live ones"
           + (f" (_bookkeeping not compared: the broker shows aborted transactions; {bookkeeping_differences} "
              f"entries differ)" if guarantee == "exactly_once" and not caps.read_committed_hides_aborted
              else ", _bookkeeping included"))
    report(f"{label}: output keys whose final value differs from the driver's: enriched "
           f"{len(off['enriched'])}, totals {len(off['totals'])} (outputs of a killed, uncommitted unit "
           f"that the replay, reading its inputs in another interleaving, did not reproduce)")
    for j in outs:
        report(f"{label}: {j} output: {dup[f'{j} records']} records (driver, uninterrupted: "
               f"{dup[f'{j} driver records']}); duplicates: {dup[j]} unchanged results re-emitted in a row, "
               f"{dup[f'{j} repeats']} records repeating an earlier record of their key (driver: "
               f"{dup[f'{j} driver repeats']}) (broker: read_committed hides aborted = "
               f"{caps.read_committed_hides_aborted}, zombie fenced = {caps.zombie_fenced}, transactions "
               f"complete after fencing = {caps.transactions_complete_after_fencing})")
    if guarantee == "exactly_once" and caps.read_committed_hides_aborted and caps.zombie_fenced:
        assert dup["enriched"] == dup["totals"] == 0
        assert off == {"enriched": [], "totals": []}
    # totals: one input partition per task upstream and a deterministic replay through the
    # repartition topic (provenance high-water marks): its output converges under both guarantees
    assert off["totals"] == []


def _sequences_of_records(records):
    seqs = {}
    for r in records:
        seqs.setdefault(r.key, []).append(r.value)
    return seqs
