"""Issue 12 end to end on a real broker: joins over topics that confluent-kafka's default
partitioner (librdkafka ``consistent_random``, CRC32) or ``fnv1a_random`` placed, not Java's murmur2.

Three tables on 4 partitions, orders (pk -> {"customer": fk, "n", "qty"}), customers
(fk -> {"region", "name"}) and shipments (keyed like orders), all produced through ONE producer
with the partitioner under test, the three topics interleaved; order updates, moves between
customers, to missing customers and to none, deletes of all three. One topology
(``partitioning_apps.issue12_topology``): a foreign-key LEFT join orders -> customers, a
primary-key inner join orders x shipments, and the count and the sum of "qty" of the foreign-key
join's rows per customer region. The first 40 % of the input is produced before the worker starts
(it detects each source's partitioner from it), the rest while it runs.

Each output topic read as a table (last value per key, a tombstone removing the key) must equal
the from-scratch result computed in plain Python from the final input tables. Before issue 12 the
foreign-key join sent subscriptions by murmur2 to a customers partition that did not hold the
customer, so most rows were wrong; most keys here are on another partition under murmur2.

Also: the refusals (a declared partitioner the data contradicts; a topic empty at start, defaulted
to murmur2, that later receives consistent-placed keys; a primary-key join over topics placed by
different partitioners), as ``processor run`` processes and in-process."""

import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from processor.engine.partitioners import CONSISTENT, MURMUR2, PARTITIONERS
from processor.engine.routing import REMEDY, REMEDY_ROUTED, PartitioningError
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import partitioning_apps as apps
from tests.integration.helpers import (
    committed_offsets,
    final_table,
    produce_with_partitioner,
    start_worker_process,
    wait_until_group_drained,
)

PARTS = 4
N = 4_000
ORDERS, CUSTOMERS, GHOSTS = 500, 80, 10
REGIONS = ("north", "south", "east", "west", "central")
FIRST_SHARE = 0.4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _js(v) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


def scenario(orders: str, customers: str, shipments: str, n: int = N, seed: int = 12):
    """``[(topic, key bytes, value bytes | None)]`` in production order, and counts by kind."""
    rnd = random.Random(seed)
    order_keys = [f"order-{i:04d}" for i in range(ORDERS)]
    shipped = order_keys[: int(ORDERS * 0.8)]
    cust_keys = [f"cust-{i:03d}" for i in range(CUSTOMERS)]
    ghosts = [f"ghost-{i:02d}" for i in range(GHOSTS)]       # never produced
    out, kinds = [], Counter()
    for i in range(n):
        r = rnd.random()
        if r < 0.45:
            k = rnd.choice(order_keys[:60] if rnd.random() < 0.3 else order_keys)   # some hot orders
            x = rnd.random()
            if x < 0.08:
                kinds["order delete"] += 1
                out.append((orders, k.encode(), None))
                continue
            fk = None if x < 0.15 else rnd.choice(ghosts) if x < 0.23 else rnd.choice(cust_keys)
            kinds["order fk None" if fk is None else "order to missing customer" if fk.startswith("ghost")
                  else "order to customer"] += 1
            out.append((orders, k.encode(), _js({"customer": fk, "n": i, "qty": rnd.randrange(1, 10)})))
        elif r < 0.7:
            k = rnd.choice(cust_keys)
            if rnd.random() < 0.1:
                kinds["customer delete"] += 1
                out.append((customers, k.encode(), None))
            else:
                kinds["customer region/name"] += 1
                out.append((customers, k.encode(), _js({"region": rnd.choice(REGIONS), "name": f"{k}-v{i}"})))
        else:
            k = rnd.choice(shipped)
            if rnd.random() < 0.1:
                kinds["shipment delete"] += 1
                out.append((shipments, k.encode(), None))
            else:
                kinds["shipment update"] += 1
                out.append((shipments, k.encode(), _js({"carrier": rnd.choice(("dhl", "ups", "post")),
                                                        "status": rnd.choice(("packed", "sent", "delivered"))})))
    return out, kinds


def expected_outputs(orders: dict, customers: dict, shipments: dict):
    """From-scratch results over the final input tables ({key bytes: value bytes})."""
    fk_left, pk_inner = {}, {}
    for pk, raw in orders.items():
        order = json.loads(raw)
        fk = order["customer"]
        cust = None if fk is None or fk.encode() not in customers else json.loads(customers[fk.encode()])
        fk_left[pk] = apps.join_order_customer(order, cust)
        if pk in shipments:
            pk_inner[pk] = apps.join_order_shipment(order, json.loads(shipments[pk]))
    counts, sums = Counter(), Counter()
    for row in fk_left.values():
        region = (row["region"] or apps.NO_REGION).encode()
        counts[region] += 1
        sums[region] += row["qty"]
    return fk_left, pk_inner, dict(counts), dict(sums)


def output_table(bootstrap: str, topic: str):
    """The output topic as a table: {key bytes: decoded JSON value}, and the number of records."""
    msgs = kafka.read_topic(bootstrap, topic)
    return {k: json.loads(v) for k, v in final_table(msgs).items()}, len(msgs)


@pytest.mark.parametrize("producer_partitioner", ["consistent_random", "murmur2_random", "fnv1a_random"])
def test_joins_and_aggregate_over_topics_of_any_partitioner(kafka_bootstrap, unique, tmp_path, report, caplog,
                                                           producer_partitioner):
    family = PARTITIONERS[producer_partitioner]
    orders, customers, shipments = f"orders-{unique}", f"customers-{unique}", f"shipments-{unique}"
    outs = {name: f"{name}-out-{unique}" for name in ("fk", "pk", "count", "sum")}
    app = f"p12-{unique}"
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in [orders, customers, shipments, *outs.values()]})

    def topology():
        return apps.issue12_topology(orders, customers, shipments, outs["fk"], outs["pk"], outs["count"], outs["sum"])

    records, kinds = scenario(orders, customers, shipments)
    first = int(N * FIRST_SHARE)
    t0 = time.monotonic()
    placed = produce_with_partitioner(kafka_bootstrap, records[:first], producer_partitioner)
    sampled = Counter(t for t, _, _ in records[:first])

    caplog.set_level(logging.INFO, logger="processor.partitioning")
    worker = Worker(topology(), kafka_bootstrap, app, tmp_path, commit_interval_ms=300,
                    consumer_config=TEST_CONSUMER_CONFIG)
    failures = []

    def run():
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:  # re-raised in the test thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="p12-worker")
    thread.start()
    try:
        n_tasks = len(worker.topology.subtopologies) * PARTS
        deadline = time.monotonic() + 60
        while len(worker.tasks) < n_tasks:
            assert not failures, failures
            assert time.monotonic() < deadline, f"the worker owns {len(worker.tasks)}/{n_tasks} tasks after 60 s"
            time.sleep(0.05)
        placed += produce_with_partitioner(kafka_bootstrap, records[first:], producer_partitioner,
                                           timestamp0=1_000_000 + first, chunk=200, pause_s=0.05)
        internal = sorted(worker.topology.internal_topics())
        wait_until_group_drained(kafka_bootstrap, app, {t: PARTS for t in [orders, customers, shipments, *internal]})
        elapsed = time.monotonic() - t0
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    if failures:
        raise failures[0]

    # the input is where the producer's partitioner put it, and murmur2 would put most elsewhere
    assert [(t, k) for t, k, _, _ in placed] == [(t, k) for t, k, _ in records]
    assert [(t, k, p) for t, k, p, _ in placed if p != family.partition(k, PARTS)] == []
    other = CONSISTENT if family is MURMUR2 else MURMUR2
    keys = {(t, k) for t, k, _ in records}
    elsewhere = sum(other.partition(k, PARTS) != family.partition(k, PARTS) for _, k in keys)
    assert elsewhere > 0.6 * len(keys)

    # the worker decided the producer's family for every source a join depends on
    decided = worker.topology.partitioning
    assert sorted(decided) == sorted([orders, customers, shipments])
    for t in (orders, customers, shipments):
        c = decided[t]
        assert (c.partitioner.name, c.how, c.checked) == (family.name, f"detected from {sampled[t]} sampled keys", True)
        line = f"partitioner of {t}: {family.name} (detected from {sampled[t]} sampled keys; checked as consumed)"
        assert line in caplog.messages, caplog.messages
        assert f"(topics: [{t}]) (stores: [" in worker.topology.describe()
        assert f"(partitioner: {family.name} (detected from {sampled[t]} sampled keys; checked as consumed))" \
            in worker.topology.describe()

    finals = {t: final_table(kafka.read_topic(kafka_bootstrap, t)) for t in (orders, customers, shipments)}
    want_fk, want_pk, want_count, want_sum = expected_outputs(finals[orders], finals[customers], finals[shipments])
    got = {name: output_table(kafka_bootstrap, t) for name, t in outs.items()}

    assert got["fk"][0] == want_fk
    assert got["pk"][0] == want_pk
    for name, want in (("count", want_count), ("sum", want_sum)):
        table = got[name][0]
        # a group whose last row left keeps 0 (Kafka Streams); whether it ever existed depends on interleaving
        assert {k: v for k, v in table.items() if v != 0} == want, name
        assert sorted(v for k, v in table.items() if k not in want) == [0] * (len(table) - len(want)), name
    # the scenario is not degenerate: every kind of row is there
    assert len(want_fk) > 300 and len(want_pk) > 200
    assert sum(r["region"] is None for r in want_fk.values()) > 30        # missing or no customer
    assert len(want_count) == len(REGIONS) + 1

    processed = worker.records_processed
    n_internal = sum(len(kafka.read_topic(kafka_bootstrap, t)) for t in internal)
    assert processed == N + n_internal
    report(f"{producer_partitioner}: {N} records ({first} before the worker started; {dict(kinds)}); "
           f"{elapsed:.1f} s from the first record produced to the group drained; "
           f"{processed} records processed ({n_internal} internal)")
    report(f"output rows (records): fk {len(got['fk'][0])} ({got['fk'][1]}), pk {len(got['pk'][0])} "
           f"({got['pk'][1]}), count {len(got['count'][0])} ({got['count'][1]}), sum {len(got['sum'][0])} "
           f"({got['sum'][1]}); keys murmur2/consistent would place elsewhere: {elsewhere}/{len(keys)}")


# -- refusals ----------------------------------------------------------------------------------------

MISPLACED = re.compile(r"key (b'[^']*') at (\S+)\[(\d+)\]@(\d+) is in partition (\d+), but partitioner (\w+) "
                       r"\(([^)]*)\) puts it in partition (\d+): joins over this topic would be silently wrong; ")


def customers_and_orders(orders: str, customers: str, n_customers: int = 120, n_orders: int = 60):
    """Customers (``cust-<i>``) then orders pointing at them, as ``(topic, key, value)`` triples."""
    out = [(customers, f"cust-{i:03d}".encode(), _js({"region": REGIONS[i % 5], "name": f"c{i}"}))
           for i in range(n_customers)]
    out += [(orders, f"order-{i:03d}".encode(), _js({"customer": f"cust-{i % n_customers:03d}", "n": i, "qty": 1}))
            for i in range(n_orders)]
    return out


def cli_run(factory: str, bootstrap: str, app: str, state_dir, env: dict, timeout: float = 90):
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "processor.cli", "run", f"tests.integration.partitioning_apps:{factory}",
         "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(state_dir),
         "--consumer-config", "session.timeout.ms=6000", "--consumer-config", "heartbeat.interval.ms=500"],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=e)


def error_line(returncode: int, stderr: str) -> str:
    """Exit code 2, no traceback, exactly one ``processor: error:`` line and it is the last line;
    returns the message after the prefix."""
    assert returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("processor: error: "), stderr[-3000:]
    assert sum("processor: error:" in line for line in lines) == 1, stderr[-3000:]
    return lines[-1].removeprefix("processor: error: ")


def check_misplaced(message: str, bootstrap: str, topic: str, partitioner: str, how: str, first_in_partition: bool,
                    remedy: str = REMEDY_ROUTED):
    """The message names a record of ``topic`` that is really there (key, partition, offset), that
    the producer's consistent_random placed, and that ``partitioner`` puts elsewhere."""
    m = MISPLACED.match(message)
    assert m, message
    key = eval(m.group(1))  # a bytes literal from our own message  # noqa: S307
    t, part, off, part2, name, got_how, expected = (m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                                                    m.group(6), m.group(7), int(m.group(8)))
    assert (t, part2, name, got_how) == (topic, part, partitioner, how), message
    msgs = [x for x in kafka.read_topic(bootstrap, topic) if x.partition() == part]
    assert msgs[off].offset() == off and msgs[off].key() == key
    assert CONSISTENT.partition(key, PARTS) == part
    assert PARTITIONERS[partitioner].partition(key, PARTS) == expected != part
    if first_in_partition:   # every earlier record of the partition is placed alike by both
        p = PARTITIONERS[partitioner]
        assert [x.offset() for x in msgs[:off] if p.partition(x.key(), PARTS) != part] == []
    # refused at start (nothing routed yet): the generic remedy; while running, the FK join has
    # routed subscriptions by this topic's partitioner: re-produce it, or reset the application
    assert message.endswith(remedy), message
    return key, part, off


def test_declared_murmur2_over_a_consistent_random_topic_is_refused_at_start(kafka_bootstrap, unique, tmp_path):
    orders, customers, out = f"orders-{unique}", f"customers-{unique}", f"out-{unique}"
    app = f"p12a-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, out: PARTS})
    produce_with_partitioner(kafka_bootstrap, customers_and_orders(orders, customers), "consistent_random")

    # in-process: the exception, before anything runs
    w = Worker(apps.fk_topology(orders, customers, out, customers_partitioner="murmur2"), kafka_bootstrap,
               app, tmp_path, consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(PartitioningError) as err:
        w.check_topics()
    assert err.value.exit_code == 2
    check_misplaced(str(err.value), kafka_bootstrap, customers, "murmur2", "declared as 'murmur2'", False, REMEDY)

    # as a process: one line, exit 2
    p = cli_run("fk_declared_murmur2", kafka_bootstrap, app, tmp_path,
                {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT": out})
    check_misplaced(error_line(p.returncode, p.stderr), kafka_bootstrap, customers, "murmur2",
                    "declared as 'murmur2'", False, REMEDY)
    assert "assigned" not in p.stderr                     # refused before it joined the group
    assert kafka.read_topic(kafka_bootstrap, out) == []
    assert committed_offsets(kafka_bootstrap, app, customers, PARTS) == {p: -1001 for p in range(PARTS)}


def test_topic_empty_at_start_then_consistent_keys_stops_the_worker(kafka_bootstrap, unique, tmp_path, report):
    """customers is empty at start, so murmur2 is assumed (checked as consumed); consistent_random
    records arriving later stop the worker at the first key murmur2 puts elsewhere."""
    orders, customers, out = f"orders-{unique}", f"customers-{unique}", f"out-{unique}"
    app = f"p12b-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, out: PARTS})
    log = tmp_path / "worker.log"
    proc = start_worker_process(kafka_bootstrap, "tests.integration.partitioning_apps:fk_detected", app,
                                tmp_path / "state", log, {"APP_ORDERS": orders, "APP_CUSTOMERS": customers,
                                                          "APP_OUTPUT": out})
    try:
        deadline = time.monotonic() + 60
        while "processor.worker: assigned" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        text = log.read_text()
        assert (f"partitioner of {customers}: murmur2 (default: the topic held no keyed record at start; "
                f"checked as consumed)") in text
        t0 = time.monotonic()
        produce_with_partitioner(kafka_bootstrap, customers_and_orders(orders, customers), "consistent_random")
        rc = proc.wait(timeout=60)
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    key, part, off = check_misplaced(error_line(rc, stderr), kafka_bootstrap, customers, "murmur2",
                                     "default: the topic held no keyed record at start", True)
    # nothing at or after the bad record was committed
    assert committed_offsets(kafka_bootstrap, app, customers, PARTS)[part] <= off
    report(f"worker stopped {stopped_s:.1f} s after the input began, at {customers}[{part}]@{off} (key {key!r})")


def test_topic_empty_at_start_then_consistent_keys_raises_in_process(kafka_bootstrap, unique, tmp_path):
    orders, customers, out = f"orders-{unique}", f"customers-{unique}", f"out-{unique}"
    app = f"p12b2-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, out: PARTS})
    w = Worker(apps.fk_topology(orders, customers, out), kafka_bootstrap, app, tmp_path,
               commit_interval_ms=300, consumer_config=TEST_CONSUMER_CONFIG)
    failures = []

    def run():
        try:
            w.run(install_signal_handlers=False)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, name="p12b-worker")
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(w.tasks) < len(w.topology.subtopologies) * PARTS:
            assert not failures and time.monotonic() < deadline, failures
            time.sleep(0.05)
        choice = w.topology.partitioning[customers]
        assert (choice.partitioner, choice.checked) == (MURMUR2, True)
        produce_with_partitioner(kafka_bootstrap, customers_and_orders(orders, customers), "consistent_random")
        thread.join(60)
    finally:
        w.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert len(failures) == 1 and type(failures[0]) is PartitioningError, failures
    assert failures[0].exit_code == 2
    check_misplaced(str(failures[0]), kafka_bootstrap, customers, "murmur2",
                    "default: the topic held no keyed record at start", True)


def test_pk_join_over_topics_of_different_partitioners_is_refused_at_start(kafka_bootstrap, unique, tmp_path):
    orders, shipments, out = f"orders-{unique}", f"shipments-{unique}", f"out-{unique}"
    app = f"p12c-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, shipments: PARTS, out: PARTS})
    keys = [f"order-{i:03d}".encode() for i in range(80)]
    produce_with_partitioner(kafka_bootstrap, [(orders, k, _js({"customer": None, "n": 1, "qty": 1})) for k in keys],
                             "consistent_random")
    produce_with_partitioner(kafka_bootstrap, [(shipments, k, _js({"carrier": "dhl", "status": "sent"}))
                                               for k in keys[:50]], "murmur2_random")
    fragments = [f"{orders} (consistent, detected from 80 sampled keys)",
                 f"{shipments} (murmur2, detected from 50 sampled keys)",
                 "co-partitioned inputs must be placed by one partitioner"]

    w = Worker(apps.pk_topology(orders, shipments, out), kafka_bootstrap, app, tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(PartitioningError) as err:
        w.check_topics()
    assert err.value.exit_code == 2
    for f in fragments:
        assert f in str(err.value), str(err.value)

    p = cli_run("pk_detected", kafka_bootstrap, app, tmp_path,
                {"APP_ORDERS": orders, "APP_SHIPMENTS": shipments, "APP_OUTPUT": out})
    message = error_line(p.returncode, p.stderr)
    assert re.match(r"KTABLE-JOIN(THIS|OTHER)-\d+ joins ", message), message
    for f in fragments:
        assert f in message, message
    assert "assigned" not in p.stderr
    assert kafka.read_topic(kafka_bootstrap, out) == []


def test_consistent_random_topic_with_empty_keys_is_detected(kafka_bootstrap, unique, tmp_path):
    orders, customers, out = f"orders-{unique}", f"customers-{unique}", f"out-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, out: PARTS})
    records = customers_and_orders(orders, customers) + [(customers, b"", _js({"region": "x", "name": "empty"}))] * 30
    # sticky.partitioning.linger.ms 0: each empty-keyed record gets its own random partition
    placed = produce_with_partitioner(kafka_bootstrap, records, "consistent_random",
                                      config={"sticky.partitioning.linger.ms": 0})
    # the empty keys went elsewhere than crc32(b"") % 4 = 0 (random, 30 times)
    assert {p for t, k, p, _ in placed if k == b""} - {CONSISTENT.partition(b"", PARTS)}
    w = Worker(apps.fk_topology(orders, customers, out), kafka_bootstrap, f"p12e-{unique}", tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.check_topics()   # was: PartitioningError "no known partitioner explains ... key b'' at ..."
    assert w.topology.partitioning[customers].partitioner is CONSISTENT


def test_routing_partitioner_is_recorded_so_a_restart_cannot_change_it(kafka_bootstrap, unique, tmp_path):
    """Run 1 starts with an empty right table: FK subscriptions are routed by the default
    (murmur2), and that is recorded. The right table then gets consistent-placed keys; run 2 does
    not re-detect (which would strand run 1's subscriptions in the wrong tasks, silently): it stops
    at start, exit 2, naming the recorded partitioner and the reset."""
    orders, customers, out = f"orders-{unique}", f"customers-{unique}", f"out-{unique}"
    app = f"p12r-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, out: PARTS})
    produce_with_partitioner(kafka_bootstrap, [(t, k, v) for t, k, v in customers_and_orders(orders, customers)
                                               if t == orders], "consistent_random")
    w = Worker(apps.fk_topology(orders, customers, out), kafka_bootstrap, app, tmp_path,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert str(w.topology.partitioning[customers]).startswith("murmur2 (default: the topic held no keyed record")
    recorded = kafka.read_topic(kafka_bootstrap, f"{app}-partitioning")
    assert [(m.key(), json.loads(m.value())["partitioner"]) for m in recorded] == [(customers.encode(), "murmur2")]
    produce_with_partitioner(kafka_bootstrap, [(t, k, v) for t, k, v in customers_and_orders(orders, customers)
                                               if t == customers], "consistent_random")
    w2 = Worker(apps.fk_topology(orders, customers, out), kafka_bootstrap, app, tmp_path,
                consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(PartitioningError) as err:
        w2.check_topics()
    msg = str(err.value)
    assert "partitioner murmur2 (recorded at the application's first start)" in msg, msg
    assert "reset the application" in msg and f" at {customers}[" in msg, msg
