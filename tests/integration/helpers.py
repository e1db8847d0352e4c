"""Helpers for the integration tests: load data, read it back, compute the driver's answer."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from processor.engine.partitioners import MURMUR2
from processor.kafka import clients as kafka
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def table_updates(n: int, keys: int, seed: int = 1, delete_rate: float = 0.1):
    """(key bytes, json value bytes | None) updates with tombstones and repeated values."""
    rnd = random.Random(seed)
    out = []
    for _i in range(n):
        k = f"k{rnd.randrange(keys):05d}".encode()
        if rnd.random() < delete_rate:
            out.append((k, None))
        else:
            out.append((k, json.dumps({"amount": rnd.randrange(0, 200)}, separators=(",", ":")).encode()))
    return out


def produce(bootstrap: str, topic: str, records, timestamp0: int = 1_000_000, timestamps=None) -> dict[int, int]:
    """Produce (key, value) pairs, record ``i`` at ``timestamp0 + i`` (or ``timestamps[i]``);
    returns {partition: end offset} from the delivery reports."""
    return produce_paced(bootstrap, topic, records, chunk=0, pause_s=0, timestamp0=timestamp0, timestamps=timestamps)


def produce_paced(bootstrap: str, topic: str, records, chunk: int, pause_s: float, timestamp0: int = 1_000_000,
                  hurry=lambda: False, timestamps=None) -> dict[int, int]:
    """Produce (key, value) pairs, record ``i`` at ``timestamp0 + i`` (or ``timestamps[i]``),
    through one producer; with ``chunk`` > 0 in chunks of ``chunk`` records each flushed and
    followed by ``pause_s`` of quiet, so a worker sees input arrive steadily; once ``hurry()`` is
    true the rest goes out at once. Returns {partition: end offset} from the delivery reports."""
    ends: dict[int, int] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    p = Producer(kafka.producer_defaults(bootstrap))
    paced = chunk > 0
    for i, (k, v) in enumerate(records):
        ts = timestamp0 + i if timestamps is None else timestamps[i]
        while True:
            try:
                p.produce(topic, v, k, timestamp=ts, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        if paced and (i + 1) % chunk == 0:
            assert p.flush(30) == 0
            paced = not hurry()
            if paced:
                time.sleep(pause_s)
    assert p.flush(30) == 0
    assert not errors, errors
    return ends


def skewed_events(n: int, keys: int, seed: int = 1, exponent: float = 1.1, amounts: int = 1000,
                  regions=("eu", "us", "apac", "latam", "mea")):
    """(key bytes, json value bytes) stream events: user keys with a Zipf-like skew (the key of
    rank r has weight 1 / (r + 1) ** exponent), value ``{"amount": int, "region": str}`` with
    regions skewed the same way."""
    rnd = random.Random(seed)
    user_keys = [f"user-{i:05d}".encode() for i in range(keys)]
    user_w = [1 / (r + 1) ** exponent for r in range(keys)]
    region_w = [1 / (r + 1) for r in range(len(regions))]
    users = rnd.choices(user_keys, weights=user_w, k=n)
    regs = rnd.choices(regions, weights=region_w, k=n)
    return [(u, json.dumps({"amount": rnd.randrange(amounts), "region": r}, separators=(",", ":")).encode())
            for u, r in zip(users, regs, strict=False)]


def by_key(messages) -> dict[bytes, list]:
    """{key: [(value bytes, timestamp), ...]} in topic order (each key lives in one partition)."""
    out = defaultdict(list)
    for m in messages:
        out[m.key()].append((m.value(), m.timestamp()[1]))
    return dict(out)


def pipe_messages(driver, messages) -> None:
    """Pipe Kafka messages (as read back from the broker) into a ``TopologyTestDriver``, in the
    given order, each at its own topic and timestamp."""
    for m in messages:
        driver.pipe_raw(m.topic(), m.key(), m.value(), m.timestamp()[1])


def driver_output_by_key(topology_factory, input_topic, output_topic, input_messages) -> dict[bytes, list]:
    """What the broker-free driver produces for the same input, partition by partition."""
    return driver_outputs_by_key(topology_factory, input_topic, [output_topic], input_messages)[output_topic]


def driver_outputs_by_key(topology_factory, input_topic, output_topics, input_messages,
                          per_partition: bool = True) -> dict[str, dict[bytes, list]]:
    """``{output topic: {key: [(value bytes, timestamp), ...]}}`` the broker-free driver produces
    for the same input: one driver per input partition (the order a task sees), or with
    ``per_partition=False`` one driver over all of it. Read after ``close()``, which flushes
    deferred emissions as a graceful worker shutdown does."""
    out = {t: defaultdict(list) for t in output_topics}
    parts = defaultdict(list)
    for m in input_messages:
        parts[m.partition() if per_partition else 0].append(m)
    for p in sorted(parts):
        d = TopologyTestDriver(topology_factory(), on_error="skip")
        with d:
            for m in parts[p]:
                d.pipe_raw(input_topic, m.key(), m.value(), m.timestamp()[1])
        for t in output_topics:
            for r in d.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()):
                out[t][r.key].append((r.value, r.timestamp))
    return {t: dict(v) for t, v in out.items()}



def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (negative: none)."""
    conf = kafka.consumer_defaults(bootstrap)
    conf["group.id"] = group
    c = Consumer(conf)
    try:
        # (a group's coordinator may move or still be loading: NOT_COORDINATOR is retried)
        tps = kafka.retry_transient(lambda: c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                        timeout=10), f"reading the offsets of group {group}")
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


# -- foreign-key joins (partitioning, interleaved two-topic input, final tables) ---------------------

def key_partition(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner (and librdkafka's ``murmur2_random``) picks for a
    non-null key: ``toPositive(murmur2(key)) % partitions`` (``processor.engine.partitioners``)."""
    return MURMUR2.partition(key, partitions)


def _produce_in_chunks(p: Producer, records, timestamp0: int, chunk: int, pause_s: float, on_delivery_of) -> None:
    """Produce ``(topic, key, value)`` triples through ``p`` in order, record ``i`` at
    ``timestamp0 + i`` with the delivery callback ``on_delivery_of(i)`` (waiting out a full
    queue); with ``chunk`` > 0 flush every ``chunk`` records and pause ``pause_s``; flush at the end."""
    for i, (topic, k, v) in enumerate(records):
        while True:
            try:
                p.produce(topic, v, k, timestamp=timestamp0 + i, on_delivery=on_delivery_of(i))
                break
            except BufferError:
                p.poll(0.05)
        if chunk > 0 and (i + 1) % chunk == 0:
            assert p.flush(30) == 0
            time.sleep(pause_s)
    assert p.flush(30) == 0


def produce_interleaved(bootstrap: str, records, timestamp0: int = 1_000_000, chunk: int = 0,
                        pause_s: float = 0.0, partitioner: str | None = None) -> dict[str, dict[int, int]]:
    """Produce ``(topic, key, value)`` triples through ONE producer in the given order (so records
    of several topics interleave in time), record ``i`` at ``timestamp0 + i``; with ``chunk`` > 0
    in chunks of ``chunk`` records, each flushed and followed by ``pause_s`` of quiet (a worker
    running meanwhile sees the input arrive over time). Returns ``{topic: {partition: end
    offset}}`` from the delivery reports. ``partitioner``: librdkafka's name (default: the
    processor's producer default, murmur2_random; ``consistent_random`` is confluent-kafka's own
    default, CRC32)."""
    ends: dict[str, dict[int, int]] = defaultdict(dict)
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            e = ends[msg.topic()]
            e[msg.partition()] = max(e.get(msg.partition(), 0), msg.offset() + 1)

    p = Producer({**kafka.producer_defaults(bootstrap), **({"partitioner": partitioner} if partitioner else {})})
    _produce_in_chunks(p, records, timestamp0, chunk, pause_s, lambda i: on_delivery)
    assert not errors, errors
    return {t: dict(e) for t, e in ends.items()}


def final_table(messages) -> dict[bytes, bytes]:
    """The table a topic describes: the last value per key, a tombstone removing the key
    (messages in topic order; each key lives in one partition)."""
    out: dict[bytes, bytes] = {}
    for m in messages:
        if m.value() is None:
            out.pop(m.key(), None)
        else:
            out[m.key()] = m.value()
    return out


def final_table_values(records) -> dict[bytes, bytes]:
    """Like ``final_table`` for the driver's OutputRecords (``.key``, ``.value``)."""
    out: dict[bytes, bytes] = {}
    for r in records:
        if r.value is None:
            out.pop(r.key, None)
        else:
            out[r.key] = r.value
    return out


def table_emission_violations(seq) -> list[str]:
    """Breaches of the table-operator invariant in one key's output sequence ``[value | None]``:
    a record equal to the previous one (an unchanged result re-emitted, or a second tombstone),
    or a tombstone for a key that had no result."""
    bad, prev, present = [], None, False
    for i, v in enumerate(seq):
        if v is None and not present:
            bad.append(f"#{i}: tombstone for a key without a result")
        elif i > 0 and v is not None and v == prev:
            bad.append(f"#{i}: unchanged result re-emitted")
        prev, present = v, v is not None
    return bad


def worker_isolation_level(guarantee: str, caps) -> str:
    """The isolation level workers and tests read with (docs/semantics.md "Isolation level"):
    ``read_committed`` under exactly-once, only where the broker (``caps``, its probed
    capabilities) completes transactions after fencing and hides aborted ones."""
    txn_reliable = caps.transactions_complete_after_fencing and caps.read_committed_hides_aborted
    return "read_committed" if guarantee == "exactly_once" and txn_reliable else "read_uncommitted"


def wait_until_workers_assigned(procs, logs, describe, timeout_s: float = 60.0) -> None:
    """Wait until every worker process's log (``logs``) says it was assigned; fail when one exited
    (with ``describe()``) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not all("processor.worker: assigned" in open(lg).read() for lg in logs):
        assert all(p.poll() is None for p in procs), describe()
        assert time.monotonic() < deadline, f"workers not assigned within {timeout_s:.0f} s"
        time.sleep(0.2)


def wait_for(cond, timeout: float, what: str, procs=(), poll_s: float = 0.1) -> None:
    """Poll ``cond()`` every ``poll_s`` until it is true; fail after ``timeout`` seconds, or as soon
    as a process of ``procs`` (``(process, log path)`` pairs) has exited (with its log's tail)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for p, log in procs:
            assert p.poll() is None, open(log).read()[-3000:]
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_until_group_drained(bootstrap: str, group: str, topics: dict[str, int], timeout_s: float = 120.0,
                             poll_s: float = 0.5, check=None) -> float:
    """Wait until ``group`` has committed every partition of ``topics`` (``{topic: partitions}``,
    internal topics included) to its end: the committed offsets are read FIRST, then the broker
    is probed (to partition EOF, not list_offsets) for records at or after them; none means
    every record was processed and committed, and so was everything those records caused (a
    worker flushes its outputs before committing). ``check()``, if given, runs on every poll
    (e.g. to fail at once with a worker's own error). Returns the seconds waited."""
    def committed():
        if check is not None:
            check()
        return {(t, p): max(off, 0) for t, n in topics.items()
                for p, off in committed_offsets(bootstrap, group, t, n).items()}

    return _wait_until_at_end(bootstrap, f"group {group} did not drain {sorted(topics)}", committed,
                              "read_uncommitted", timeout_s, poll_s)


def open_transactions(bootstrap: str, topics) -> list[tuple[str, int]]:
    """The partitions of ``topics`` with a transaction open: their last stable offset (where a
    read_committed consumer reaches partition EOF) is below their high watermark (read_uncommitted's
    EOF). Both found by fetching (``snapshot_end_offsets``), the high watermark first."""
    from processor.kafka.partition_ends import snapshot_end_offsets

    topics = list(topics)
    if not topics:
        return []
    hw = snapshot_end_offsets(bootstrap, topics, consumer_config={"isolation.level": "read_uncommitted"})
    lso = snapshot_end_offsets(bootstrap, topics, consumer_config={"isolation.level": "read_committed"})
    return sorted(k for k, end in hw.items() if lso[k] < end)


def wait_until_tasks_committed(bootstrap: str, topology, topics: dict[str, int], isolation_level: str,
                               timeout_s: float = 120.0, poll_s: float = 0.5, check=None,
                               settled: list[str] | tuple[str, ...] = ()) -> float:
    """Like ``wait_until_group_drained``, but by the workers' own truth: the last commit record in
    each task changelog (``topology``: bound to its application id) names the input positions
    its unit covered; drained when those reach the end of every partition of ``topics``. Needed
    where the broker may never write the group offsets of a committed transaction (probe
    ``transactions_complete_after_fencing``). Reads with ``isolation_level`` (read_committed
    where the broker hides aborted transactions, so an aborted unit's commit record does not
    count). ``check()``, if given, runs on every poll (e.g. to fail at once when a worker
    process exited). Returns the seconds waited.

    Under ``read_committed`` it also waits until no transaction is open on ``topics`` and on the
    ``settled`` topics (outputs the test reads next): a worker SIGKILLed with a transaction open
    under a transactional id that never comes back (a wiped state directory, a worker not
    restarted) holds the last stable offset of every partition it wrote until the broker aborts
    that transaction (``transaction.timeout.ms``). Until then the workers, reading
    read_committed, see nothing of an internal partition past it, and a reader of the outputs
    nothing past it either: the positions "at the end" would be at that offset, not at the end."""
    from processor.state import commit_record
    from processor.state.store import TASK_STORE

    conf = kafka.consumer_defaults(bootstrap)
    conf.update({"group.id": f"drain-{time.time_ns()}", "isolation.level": isolation_level,
                 "fetch.wait.max.ms": 50})
    c = Consumer(conf)
    c.assign([TopicPartition(topology.changelog_topic(TASK_STORE, i), p, OFFSET_BEGINNING)
              for i in range(len(topology.subtopologies))
              for p in range(max(topics[t] for t in topology.source_topics(i)))])
    latest: dict[tuple[str, int], dict] = {}   # task changelog partition -> its last commit's positions

    def committed():
        if check is not None:
            check()
        while True:   # the task changelogs as far as they go now
            data = [m for m in c.consume(5000, 0.2) if m.error() is None]
            if not data:
                break
            for m in data:
                if m.key() == commit_record.COMMIT_KEY:
                    latest[(m.topic(), m.partition())] = commit_record.decode(m.value()).positions
        out = {(t, p): 0 for t, n in topics.items() for p in range(n)}
        for pos in latest.values():
            for tp, off in pos.items():
                if tp in out:
                    out[tp] = max(out[tp], off)
        return out

    stable = None
    if isolation_level == "read_committed":
        def stable():
            return open_transactions(bootstrap, [*topics, *settled])

    try:
        return _wait_until_at_end(bootstrap, f"the tasks' commit records did not reach the end of {sorted(topics)}",
                                  committed, isolation_level, timeout_s, poll_s, stable)
    finally:
        c.close()


def _wait_until_at_end(bootstrap: str, failure: str, committed, isolation_level: str, timeout_s: float,
                       poll_s: float, open_transactions=None) -> float:
    """Poll ``committed()`` (``{(topic, partition): offset}``) until no partition holds a record at
    or after its offset (partition EOF, read with ``isolation_level``) and ``open_transactions()``,
    if given, names no partition; on timeout fail with ``failure`` and each lagging partition's
    committed offset and high watermark (or the partitions with a transaction open)."""
    t0 = time.monotonic()
    while True:
        at = committed()
        behind = kafka.partitions_with_records_from(bootstrap, at, isolation_level=isolation_level)
        still_open = open_transactions() if not behind and open_transactions is not None else []
        if not behind and not still_open:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            if not behind:
                raise AssertionError(f"{failure} within {timeout_s:.0f} s: a transaction is still open on "
                                     f"{[f'{t}[{p}]' for t, p in still_open]}")
            raise AssertionError(f"{failure} within {timeout_s:.0f} s; behind (committed offset / high "
                                 f"watermark): {_lag_report(bootstrap, {tp: at[tp] for tp in behind})}")
        time.sleep(poll_s)


def _lag_report(bootstrap: str, committed: dict[tuple[str, int], int]) -> list[str]:
    """``topic[p]: committed/high-watermark`` for a failure message (a diagnostic, so the
    watermark query is fine here)."""
    conf = kafka.consumer_defaults(bootstrap)
    conf["group.id"] = f"lag-{time.time_ns()}"
    c = Consumer(conf)
    try:
        out = []
        for (t, p), off in sorted(committed.items()):
            try:
                hw = c.get_watermark_offsets(TopicPartition(t, p), timeout=5)[1]
            except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the real failure
                hw = f"? ({e})"
            out.append(f"{t}[{p}]: {off}/{hw}")
        return out
    finally:
        c.close()


# -- reliability (issue 5): workers as processes, stores as bytes ---------------------------------

def reliability_scenario(orders_topic: str, customers_topic: str, n: int, seed: int = 5,
                         orders: int = 2_000, customers: int = 300):
    """``[(topic, key, value | None)]``: 60 % order updates (pk -> {"customer", "n", "amount"};
    moves between customers, to missing customers, to none, deletes) and 40 % customer updates
    (name/tier changes, "visits"-only changes, deletes), interleaved."""
    rnd = random.Random(seed)
    out = []
    custs: dict[str, dict] = {}
    for i in range(n):
        if rnd.random() < 0.6:
            k = f"order-{rnd.randrange(orders):05d}".encode()
            r = rnd.random()
            if r < 0.07:
                out.append((orders_topic, k, None))
                continue
            fk = (None if r < 0.12
                  else f"ghost-{rnd.randrange(20)}" if r < 0.2 else f"cust-{rnd.randrange(customers):03d}")
            out.append((orders_topic, k, json.dumps({"customer": fk, "n": i, "amount": rnd.randrange(1, 500)},
                                                    separators=(",", ":")).encode()))
        else:
            k = f"cust-{rnd.randrange(customers):03d}"
            cur = custs.get(k)
            r = rnd.random()
            if r < 0.1:
                custs.pop(k, None)
                out.append((customers_topic, k.encode(), None))
                continue
            if cur is not None and r < 0.4:
                new = dict(cur, visits=cur["visits"] + 1)
            else:
                new = {"name": f"{k}-v{i}", "tier": rnd.choice(("gold", "silver")),
                       "visits": 0 if cur is None else cur["visits"]}
            custs[k] = new
            out.append((customers_topic, k.encode(), json.dumps(new, separators=(",", ":")).encode()))
    return out


def order_totals(order_messages) -> dict:
    """The totals the reliability topology should hold, folded in plain Python from the final
    orders table: per customer, the sum of the amounts and the number of orders."""
    totals: dict = {}
    for v in final_table(order_messages).values():
        o = json.loads(v)
        if o["customer"] is not None:
            t = totals.setdefault(o["customer"], {"sum": 0, "orders": 0})
            t["sum"] += o["amount"]
            t["orders"] += 1
    return totals


def start_worker_process(bootstrap: str, spec: str, app: str, state_dir, log_path, env: dict,
                         guarantee: str = "at_least_once", commit_interval_ms: int = 300,
                         consumer_config: list[str] = (), extra_args: list[str] = (), log_level: str = "INFO"):
    """``python -m processor.cli run SPEC`` as a child process (stderr to ``log_path``, appended);
    ``consumer_config``: extra ``key=value`` consumer settings."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = root + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "processor.cli", "--log-level", log_level, "run", spec,
         "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(state_dir),
         "--commit-interval-ms", str(commit_interval_ms), "--processing-guarantee", guarantee,
         "--consumer-config", "session.timeout.ms=6000", "--consumer-config", "heartbeat.interval.ms=500",
         *[a for kv in consumer_config for a in ("--consumer-config", kv)], *extra_args],
        cwd=root, env=e, stdout=subprocess.DEVNULL, stderr=open(log_path, "a"))


def start_workers(bootstrap: str, spec: str, app: str, directory, env: dict, guarantee: str,
                  consumer_config: list[str], n: int = 2):
    """``n`` worker processes (``start_worker_process``), worker ``i`` with the state directory
    ``directory / w{i}`` and the log ``directory / w{i}.log``. Returns (state dirs, logs, processes)."""
    state = [directory / f"w{i}" for i in range(n)]
    logs = [directory / f"w{i}.log" for i in range(n)]
    procs = [start_worker_process(bootstrap, spec, app, state[i], logs[i], env, guarantee,
                                  consumer_config=consumer_config) for i in range(n)]
    return state, logs, procs


def stop_workers(procs, logs) -> None:
    """SIGTERM to every worker process, then each must exit with 0 within 60 s (else its log's tail)."""
    import signal

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for i, p in enumerate(procs):
        assert p.wait(60) == 0, open(logs[i]).read()[-3000:]


def kill_leftover_workers(procs) -> None:
    """SIGKILL (and reap) every worker process of ``procs`` still running: a test's cleanup."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def task_store_bytes(task_dirs, stores, by_task: bool = False) -> dict[str, dict]:
    """``{store: {key: value bytes}}`` over the given task databases (RocksDB, read-only use).
    Stores whose keys repeat across tasks (``_bookkeeping``: every task keeps marks for the same
    source partitions) cannot be merged: ``by_task`` keys them ``(task directory name, key)``,
    and merging a key found in two tasks fails (it would hide one task's value)."""
    from pathlib import Path

    from processor.state.rocksdb import RocksDBDatabase

    out = {s: {} for s in stores}
    seen: dict[tuple[str, bytes], str] = {}
    for d in task_dirs:
        name = Path(d).name
        db = RocksDBDatabase(d)
        try:
            have = set(db.column_families())
            for s in stores:
                if s not in have:
                    continue
                for k, v in db.store(s).items():
                    if by_task:
                        out[s][(name, k)] = v
                        continue
                    other = seen.setdefault((s, k), name)
                    assert other == name, (f"store {s}: key {k!r} is in tasks {other} and {name}; "
                                           f"compare it by_task")
                    out[s][k] = v
        finally:
            db.close()
    return out


def latest_task_dirs(state_dirs) -> dict[str, object]:
    """Per task directory name (``task-<sub>_<p>``), the copy among ``state_dirs`` (each an
    application's state directory) with the highest committed unit: the last owner's."""
    from pathlib import Path

    from processor.state import commit_record
    from processor.state.rocksdb import RocksDBDatabase
    from processor.state.store import TASK_STORE

    best: dict[str, tuple[int, Path]] = {}
    for sd in state_dirs:
        for d in sorted(Path(sd).glob("task-*")):
            db = RocksDBDatabase(d)
            try:
                raw = db.store(TASK_STORE).get(commit_record.COMMIT_KEY)
            finally:
                db.close()
            unit = -1 if raw is None else commit_record.decode(raw).unit
            if d.name not in best or unit > best[d.name][0]:
                best[d.name] = (unit, d)
    return {name: d for name, (_, d) in best.items()}


def driver_store_bytes(driver, stores) -> dict[str, dict[bytes, bytes]]:
    """``{store: {key: value bytes}}`` of a TopologyTestDriver's tasks (memory stores)."""
    out = {s: {} for s in stores}
    for t in driver.tasks:
        for s in stores:
            if any(spec.name == s for spec in t.store_specs):
                out[s].update(t.stores.store(s).items())
    return out


# -- partitioners (issue 12): input produced by a chosen librdkafka partitioner -------------------

def produce_with_partitioner(bootstrap: str, records, partitioner: str, timestamp0: int = 1_000_000,
                             chunk: int = 0, pause_s: float = 0.0,
                             config: dict | None = None) -> list[tuple[str, bytes, int, int]]:
    """Produce ``(topic, key, value)`` triples through ONE confluent-kafka producer configured with
    librdkafka's ``partitioner`` (e.g. ``consistent_random``, confluent-kafka's default), in the
    given order, record ``i`` at ``timestamp0 + i``; with ``chunk`` > 0 in chunks of ``chunk``
    records, each flushed and followed by ``pause_s`` of quiet; ``config``: more producer settings.
    Returns, per record in production order, ``(topic, key, partition, offset)`` from the delivery
    reports."""
    got: dict[int, tuple[str, bytes, int, int]] = {}
    errors = []

    def report(i):
        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            else:
                got[i] = (msg.topic(), msg.key(), msg.partition(), msg.offset())
        return on_delivery

    conf = kafka.producer_defaults(bootstrap)
    conf["partitioner"] = partitioner
    conf.update(config or {})
    p = Producer(conf)
    records = list(records)
    _produce_in_chunks(p, records, timestamp0, chunk, pause_s, report)
    assert not errors, errors[:5]
    assert len(got) == len(records)
    return [got[i] for i in range(len(records))]


def produce_out_of_order(bootstrap: str, topic: str, n: int, seed: int, keys: int = 60,
                         lateness: int = 50) -> None:
    """``n`` JSON records ``{"x": 0-9}`` over ``keys`` keys in arrival order, each with its own
    timestamp up to ``lateness`` ms before the clock's (out of order), placed by Java's murmur2."""
    rnd = random.Random(seed)
    conf = kafka.producer_defaults(bootstrap)
    conf["partitioner"] = "murmur2_random"
    p = Producer(conf)
    clock = 1_000_000
    for _ in range(n):
        clock += rnd.choice([0, 1, 3, 10, 90])
        p.produce(topic, json.dumps({"x": rnd.randrange(10)}).encode(), f"u{rnd.randrange(keys):02d}".encode(),
                  timestamp=clock - rnd.randrange(lateness))
    assert p.flush(30) == 0


def worker_equals_driver_per_partition(bootstrap: str, topology_for, t: dict, app: str, state_dir, input_topic: str,
                                       outputs: list[str], stores, partitions: int = 3) -> tuple[dict, dict]:
    """Run a ``Worker`` over ``input_topic`` until drained, then the test driver over each input
    partition's records in offset order: the worker's task ``0_<p>`` stores equal the driver's
    byte for byte, and each output's records per key equal the driver's in order. Returns the
    driver's outputs (``{topic: {key: [(value, timestamp)]}}``) and metrics summed by name."""
    from processor.runtime.worker import Worker
    from tests.conftest import TEST_CONSUMER_CONFIG

    w = Worker(topology_for(t), bootstrap, app, state_dir, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    inputs = kafka.read_topic(bootstrap, input_topic)
    want: dict = {o: defaultdict(list) for o in outputs}
    metrics: dict = defaultdict(int)
    for part in range(partitions):
        with TopologyTestDriver(topology_for(t), application_id=app) as d:
            for m in (m for m in inputs if m.partition() == part):
                d.pipe_raw(input_topic, m.key(), m.value(), m.timestamp()[1])
            for o in want:
                for r in d.read_output(o, Serdes.bytes(), Serdes.bytes()):
                    want[o][r.key].append((r.value, r.timestamp))
            expected = driver_store_bytes(d, stores)
            for op_metrics in d.metrics().values():
                for k, v in op_metrics.items():
                    metrics[k] += v
        assert task_store_bytes([state_dir / app / f"task-0_{part}"], stores) == expected, part
    for o in want:
        assert by_key(kafka.read_topic(bootstrap, o)) == want[o], o
    return want, metrics


def assigned_partitions_now(log_text: str) -> set[int]:
    """The partition numbers of a worker log's last "assigned" line: the whole assignment after the
    last change (a cooperative rebalance logs one such line per change, a revocation included)."""
    import re

    lines = [ln for ln in log_text.splitlines() if "processor.worker: assigned" in ln]
    return {int(p) for p in re.findall(r"\[(\d+)\]@", lines[-1])} if lines else set()


# -- fleets under load (issue 36): steady input, a watch on the outputs ---------------------------

class SteadyLoad:
    """Events arriving steadily, from a thread (``start``/``stop``): every ``interval_s`` one round
    ``r`` of events ``(topic, key, {"r": r})`` for ``keys[r % stride::stride]``, produced through
    ONE producer with librdkafka's ``murmur2_random`` (Java's partitioner) and flushed; a round is
    appended to ``produced`` (``(topic, key bytes, value bytes)``) once the broker acknowledged it.
    A delivery error fails ``stop``."""

    def __init__(self, bootstrap: str, topic: str, keys: list[str], stride: int, interval_s: float = 0.05):
        import threading

        self.bootstrap, self.topic, self.keys, self.stride, self.interval_s = bootstrap, topic, keys, stride, interval_s
        self.produced: list[tuple[str, bytes, bytes]] = []
        self.acked: list[float] = []   # when each round was acknowledged (time.monotonic())
        self.rounds = 0
        self.errors: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="steady-load")

    def start(self) -> SteadyLoad:
        self._thread.start()
        return self

    def _run(self) -> None:
        conf = kafka.producer_defaults(self.bootstrap)
        conf["partitioner"] = "murmur2_random"
        p = Producer(conf)

        def on_delivery(err, _msg):
            if err is not None:
                self.errors.append(err)

        try:
            r = 0
            while not self._stop.is_set():
                batch = [(self.topic, k.encode(), json.dumps({"r": r}).encode())
                         for k in self.keys[r % self.stride::self.stride]]
                for t, k, v in batch:
                    p.produce(t, v, k, on_delivery=on_delivery)
                if p.flush(30) != 0:
                    self.errors.append(f"round {r}: not acknowledged within 30 s")
                    return
                self.acked.append(time.monotonic())
                self.produced.extend(batch)
                r += 1
                self.rounds = r
                time.sleep(self.interval_s)
        except Exception as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def longest_pause(self, start: float, end: float) -> float:
        """The longest time within ``[start, end]`` (monotonic) between two acknowledged rounds
        (the last before ``start`` and the silence up to ``end`` included): when the input itself
        stalled (a slow broker, a starved machine), so did every output."""
        times = [t for t in self.acked if t < start][-1:] + [t for t in self.acked if start <= t <= end] + [end]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=end - start)

    def stop(self, check: bool = True) -> list[tuple[str, bytes, bytes]]:
        """Stop producing (after the round under way; again: nothing more); returns ``produced``.
        ``check``: fail if the thread did not stop or a round failed (a test's cleanup passes
        False, so as not to hide the failure it cleans up after)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(60)
        if check:
            assert not self._thread.is_alive(), "the load thread did not stop"
            assert not self.errors, self.errors[:5]
        return self.produced


class OutputWatch:
    """The high watermark of every partition of ``topic``, asked in rounds every ``interval_s``
    from a thread (``start``/``stop``): when each round began, and when each partition's
    watermark was first seen to change. A partition's output gap is the longest time between two
    changes seen (``gaps``), known to within the longest round (its ``resolution``)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.05):
        import threading

        self.bootstrap, self.topic, self.partitions, self.interval_s = bootstrap, topic, partitions, interval_s
        self.ends: dict[int, list[tuple[float, int]]] = {p: [] for p in range(partitions)}   # (seen at, high)
        self.samples: list[float] = []   # when each round began (time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="output-watch")

    def start(self) -> OutputWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"watch-{time.time_ns()}"})
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                self.samples.append(now)
                for p in range(self.partitions):
                    _, high = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)
                    if not self.ends[p] or self.ends[p][-1][1] != high:
                        self.ends[p].append((now, high))
                time.sleep(self.interval_s)
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)

    def gaps(self, partitions, start: float, end: float, edges: bool = False) -> tuple[dict[int, float], float]:
        """Per partition of ``partitions``, the longest time between two changes of its watermark
        seen within ``[start, end]`` (monotonic times inside the watch's run); with ``edges`` also
        the silences across the window's edges (from the last change before ``start`` to the first
        after it, from the last change to ``end``). And the resolution: the longest round in the
        window and across its edges. (On Tansu the watermark is the last batch's base offset + 1, and 0 while a
        transaction holds records there: under exactly once a change is a transaction's first
        record or its commit.)"""
        spans, resolution = self.gap_spans(partitions, start, end, edges)
        return {p: b - a for p, (a, b) in spans.items()}, resolution

    def gap_spans(self, partitions, start: float, end: float,
                  edges: bool = False) -> tuple[dict[int, tuple[float, float]], float]:
        """Like ``gaps``, each longest silence as ``(from, to)`` (monotonic times)."""
        window = [t for t in self.samples if start <= t <= end]
        # the rounds across the window's edges count too: a round that began before ``start`` (or
        # ended after ``end``) is what the watch saw there (a loaded machine: a round over 1 s)
        before = [t for t in self.samples if t < start][-1:]
        after = [t for t in self.samples if t > end][:1]
        assert window and (before or window[0] - start < 1) and (after or end - window[-1] < 1), \
            "the watch did not cover the window"
        rounds = before + window + after
        resolution = max((b - a for a, b in zip(rounds, rounds[1:], strict=False)), default=0.0)
        out = {}
        for p in partitions:
            seen = [t for t, _ in self.ends[p]]
            times = [t for t in seen if start <= t <= end]
            if edges:
                times = [t for t in seen if t < start][-1:] + times + [end]
            out[p] = max(zip(times, times[1:], strict=False), key=lambda ab: ab[1] - ab[0], default=(start, end))
        return out, resolution


class FirstNewRecords:
    """When the first record past each partition's end arrives, from a thread (``start``/``stop``):
    a read_uncommitted consumer reads ``partitions`` of ``topic`` to their ends as they are when
    it gets there (partition EOF, found by fetching: Tansu's ListOffsets and uncached watermarks
    report the last batch's base offset + 1, and 0 for good once a transaction is left open on
    the partition, as a SIGKILLed exactly-once worker leaves it), sets ``ready``, then notes in
    ``first`` the time (``time.monotonic()``) the first later record of each partition arrived."""

    def __init__(self, bootstrap: str, topic: str, partitions):
        import threading

        self.bootstrap, self.topic, self.partitions = bootstrap, topic, set(partitions)
        self.ends: dict[int, int] = {}
        self.first: dict[int, float] = {}
        self.ready = threading.Event()
        self.errors: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="first-new-records")

    def start(self) -> FirstNewRecords:
        self._thread.start()
        return self

    def _run(self) -> None:
        from confluent_kafka import KafkaError

        conf = kafka.consumer_defaults(self.bootstrap)
        conf.update({"group.id": f"first-new-{time.time_ns()}", "isolation.level": "read_uncommitted",
                     "fetch.wait.max.ms": 50, "enable.partition.eof": True})
        c = Consumer(conf)
        try:
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(self.partitions)])
            while not self._stop.is_set() and len(self.first) < len(self.partitions):
                for m in c.consume(1000, 0.1):
                    p = m.partition()
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            self.ends.setdefault(p, m.offset())
                        else:
                            self.errors.append(m.error())
                    elif p in self.ends and p not in self.first:
                        self.first[p] = time.monotonic()
                if len(self.ends) == len(self.partitions):
                    self.ready.set()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)


# -- counts per key under failures (issue 46): paced rounds in, exact sequences out ---------------

def produce_count_rounds(bootstrap: str, topic: str, keys: int, rounds: int, pace_s: float, produced: list[int],
                         stop=None, **producer_config) -> None:
    """``rounds`` rounds of one event ``{"r": r}`` for each of ``keys`` keys (``k0000``...), spread
    evenly over ``pace_s`` seconds, through one producer with Java's partitioner (extra librdkafka
    settings in ``producer_config``); ``produced[0]`` counts the events handed to the producer. A
    set ``stop`` (a ``threading.Event``) ends it after the current round. Every event must be
    acknowledged (flush)."""
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5,
                  **producer_config})
    t0 = time.monotonic()
    for r in range(rounds):
        for k in range(keys):
            while True:
                try:
                    p.produce(topic, key=f"k{k:04d}".encode(), value=json.dumps({"r": r}).encode())
                    break
                except BufferError:
                    p.poll(0.1)
        p.poll(0)
        produced[0] += keys
        wait = t0 + (r + 1) * pace_s / rounds - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if stop is not None and stop.is_set():
            break
    assert p.flush(120) == 0


class CountSequences:
    """A counts-per-key output topic read as a downstream read_committed consumer reads it, against
    ``1..rounds`` for each of ``keys`` keys: ``counts`` (key -> the counts in order), ``want``,
    ``doubled`` (outputs beyond the first of their value) and ``missing`` (counts never seen)."""

    def __init__(self, bootstrap: str, topic: str, keys: int, rounds: int):
        self.counts: dict[bytes, list[int]] = {}
        for m in kafka.read_topic(bootstrap, topic, isolation_level="read_committed"):
            self.counts.setdefault(m.key(), []).append(json.loads(m.value()))
        self.want = {f"k{k:04d}".encode(): list(range(1, rounds + 1)) for k in range(keys)}
        self.doubled = sum(len(v) - len(set(v)) for v in self.counts.values())
        self.missing = sum(len(set(w) - set(self.counts.get(k, []))) for k, w in self.want.items())

    def differing(self) -> dict[bytes, list[int]]:
        """The keys whose outputs are not exactly ``1..rounds``, with their outputs."""
        return {k: self.counts.get(k, []) for k, w in self.want.items() if self.counts.get(k) != w}
