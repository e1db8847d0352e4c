"""Scaling on a real broker (issue 5): 1 -> 3 -> 1 worker processes during a run give the same
final tables as one worker for the whole run.

Two applications read the same input (30,000 interleaved order and customer updates on 4 + 4
partitions, arriving in chunks over ~12 s) through the reliability topology (a foreign-key join
``enriched`` and an aggregation ``totals`` through ``<app>-totals-repartition``):

- run A: ONE worker process for the whole run;
- run B: one worker process; once a third of the input is out two more join the group while
  the input keeps arriving (each must be assigned partitions and process records, the first
  must see its assignment shrink); a sixth of the input arrives while all three are assigned;
  once two thirds are out (and the three ran together for 2 s at least) both are stopped with
  SIGTERM (exit 0) and the first takes every task back (restoring what the others committed
  from the changelogs) while the last third arrives.

Then every materialized table (the two source tables, the join result, the aggregate and its
last-emitted column) of run B, in each task's last owner's RocksDB, equals run A's byte for byte
(the join result: its value bytes; its timestamp is max(left, right) at resolution, which
depends on how partitions interleave; the differences are counted and reported), run A's equal
the broker-free driver's, and the final tables of B's output topics equal A's (and the driver's).
"""

import json
import re
import signal
import threading
import time

from processor.kafka import clients as kafka
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.integration import apps
from tests.integration.helpers import (
    driver_store_bytes,
    final_table,
    final_table_values,
    latest_task_dirs,
    order_totals,
    pipe_messages,
    produce_interleaved,
    reliability_scenario,
    start_worker_process,
    task_store_bytes,
    wait_for,
    wait_until_group_drained,
)

N = 30_000
PARTS = 4
CHUNK = 500
PAUSE_S = 0.2           # 60 chunks: the input arrives over ~12 s, plus the waits for the rebalances
SPEC = "tests.integration.apps:reliability_topology"
TABLES = ("orders-store", "customers-store", "enriched", "totals", "totals.emitted")


def assignments(log) -> list[list[tuple[str, int]]]:
    """Every assignment a worker logged, in order: [(topic, partition), ...] each."""
    out = []
    for line in open(log):
        if "processor.worker: assigned" in line:
            tail = line.split("processor.worker: assigned", 1)[1]
            out.append(sorted((t, int(p)) for t, p in re.findall(r"(\S+?)\[(\d+)\]@", tail)))
    return out


def records_processed(log) -> int:
    m = re.search(r"stopped after (\d+) records", open(log).read())
    assert m, open(log).read()[-3000:]
    return int(m.group(1))


def test_scale_1_3_1_workers_final_tables_equal_single_worker_run(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                   report):
    orders, customers = f"orders-{unique}", f"customers-{unique}"
    app = {"A": f"scale-a-{unique}", "B": f"scale-b-{unique}"}
    outs = {r: {"enriched": f"{a}-enriched", "totals": f"{a}-totals"} for r, a in app.items()}  # prefix = app id
    env = {r: {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": app[r]} for r in app}
    for k, v in env["A"].items():
        monkeypatch.setenv(k, v)   # the driver below builds run A's topology
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS,
                                          **{t: PARTS for r in outs for t in outs[r].values()}})
    records = reliability_scenario(orders, customers, N)
    internal = {r: [f"{a}-totals-repartition", f"{a}-enriched-subscription-registration-topic",
                    f"{a}-enriched-subscription-response-topic"] for r, a in app.items()}
    every_tp = {r: sorted((t, p) for t in [orders, customers] + internal[r] for p in range(PARTS)) for r in app}

    state = {"A": tmp_path / "a", "B0": tmp_path / "b0", "B1": tmp_path / "b1", "B2": tmp_path / "b2"}
    logs = {w: tmp_path / f"{w}.log" for w in state}

    def start(w):
        return start_worker_process(kafka_bootstrap, SPEC, app[w[0]], state[w], logs[w], env[w[0]])

    procs = {}
    timeline = []
    gates, abort = [threading.Event() for _ in range(4)], threading.Event()
    try:
        procs["A"], procs["B0"] = start("A"), start("B0")
        wait_for(lambda: all(assignments(logs[w]) for w in ("A", "B0")), 60, "the first workers' assignment",
                 [(procs[w], logs[w]) for w in procs])
        # the input in four parts, paced, each released by the test: the first third before the
        # scale-out, the next sixth during its rebalance, the next sixth with three workers
        # assigned, the last third from the scale-in on (one worker alone finishes the run)
        produced, errors = {}, []
        parts = [(0, N // 3), (N // 3, N // 2), (N // 2, 2 * N // 3), (2 * N // 3, N)]
        done = [threading.Event() for _ in parts]

        def produce_parts():
            try:
                for i, (lo, hi) in enumerate(parts):
                    assert gates[i].wait(180), f"input part {i} never released"
                    if abort.is_set():
                        return
                    for t, ends in produce_interleaved(kafka_bootstrap, records[lo:hi], timestamp0=1_000_000 + lo,
                                                       chunk=CHUNK, pause_s=PAUSE_S).items():
                        for part, end in ends.items():
                            produced.setdefault(t, {})[part] = max(produced.get(t, {}).get(part, 0), end)
                    timeline.append((round(time.monotonic() - t0, 1), f"input {lo}..{hi} produced"))
                    done[i].set()
            except BaseException as exc:
                errors.append(exc)
                for e in done:
                    e.set()

        producer = threading.Thread(target=produce_parts, daemon=True)
        t0 = time.monotonic()
        gates[0].set()
        producer.start()

        # scale out: 1 -> 3 once the first third is out; input keeps arriving meanwhile
        assert done[0].wait(120) and not errors, errors
        procs["B1"], procs["B2"] = start("B1"), start("B2")
        gates[1].set()
        timeline.append((round(time.monotonic() - t0, 1), "B1, B2 started"))
        wait_for(lambda: all(assignments(logs[w]) for w in ("B1", "B2"))
                 and len(assignments(logs["B0"])) >= 2, 60, "the scaled-out assignment",
                 [(procs[w], logs[w]) for w in procs])
        assigned_at = time.monotonic()
        timeline.append((round(assigned_at - t0, 1), "B1, B2 assigned"))
        assert done[1].wait(120) and not errors, errors
        gates[2].set()

        # scale in: 3 -> 1 once that part is out and the three ran together for 2 s at least
        assert done[2].wait(120) and not errors, errors
        time.sleep(max(0.0, assigned_at + 2.0 - time.monotonic()))
        for w in ("B1", "B2"):
            procs[w].send_signal(signal.SIGTERM)
        gates[3].set()
        timeline.append((round(time.monotonic() - t0, 1), "B1, B2 sent SIGTERM"))
        for w in ("B1", "B2"):
            assert procs[w].wait(60) == 0, open(logs[w]).read()[-3000:]
        timeline.append((round(time.monotonic() - t0, 1), "B1, B2 exited 0"))

        producer.join(180)
        assert not producer.is_alive() and not errors, errors
        produce_s = time.monotonic() - t0
        drained = {}
        for r in app:
            wait_until_group_drained(kafka_bootstrap, app[r], {t: PARTS for t in [orders, customers] + internal[r]},
                                     timeout_s=240)
            drained[r] = round(time.monotonic() - t0, 1)
        for w in ("A", "B0"):
            assert procs[w].poll() is None, f"{w} died on its own: " + open(logs[w]).read()[-3000:]
            procs[w].send_signal(signal.SIGTERM)
        for w in ("A", "B0"):
            assert procs[w].wait(60) == 0, open(logs[w]).read()[-3000:]
    finally:
        abort.set()
        for g in gates:
            g.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sum(n for e in produced.values() for n in e.values()) == N
    for w in state:
        text = open(logs[w]).read()
        assert "processor: error" not in text and "Traceback" not in text, (w, text[-3000:])

    # the rebalances happened: A and B1/B2 ... B0 had everything, then a part, then everything again
    a_assign, b0_assign = assignments(logs["A"]), assignments(logs["B0"])
    assert a_assign == [every_tp["A"]]   # run A: one worker, one assignment, never disturbed
    assert b0_assign[0] == every_tp["B"] and b0_assign[-1] == every_tp["B"], b0_assign
    assert any(0 < len(a) < len(every_tp["B"]) for a in b0_assign[1:-1]), [len(a) for a in b0_assign]
    scaled_out = {}
    for w in ("B1", "B2"):
        got = assignments(logs[w])
        assert any(got) and all(set(a) <= set(every_tp["B"]) for a in got), (w, got)
        scaled_out[w] = (sorted({tp for a in got for tp in a}), records_processed(logs[w]))
        assert scaled_out[w][1] > 0, w   # they processed part of the input
    # every task B0 gave away came back restored with what B1/B2 committed (3 tasks per partition number)
    # co-partitioned: a task's partitions (partition p of every topic its sub-topology reads) move together
    topo_b = apps.reliability_topology().for_application(app["B"])
    # kept: the tasks B0 ran in every assignment (on a loaded machine the scale-out may take more
    # than one intermediate assignment, each giving away some tasks)
    kept = None
    for assignment in b0_assign[1:-1]:
        tasks = set()
        for sub in range(len(topo_b.subtopologies)):
            per_topic = [{p for t, p in assignment if t == topic} for topic in topo_b.source_topics(sub)]
            assert all(ps == per_topic[0] for ps in per_topic), (sub, per_topic)
            tasks |= {(sub, p) for p in per_topic[0]}
        kept = tasks if kept is None else kept & tasks
    # (a task B0 never committed before giving it away, and that nobody committed meanwhile,
    # reopens with nothing to restore and no local state: no line; CI saw 8 of 9 once)
    restored_b0 = set(re.findall(r"restored task (\d+_\d+) ", open(logs["B0"]).read()))
    restores_b0 = len(restored_b0)
    assert 0 < restores_b0 <= 3 * PARTS - len(kept or ()), (sorted(restored_b0), sorted(kept or ()))
    restores_scaled_out = sum(open(logs[w]).read().count("restored task ") for w in ("B1", "B2"))

    # the stores: B's last owners == A == the driver
    left_msgs, right_msgs = kafka.read_topic(kafka_bootstrap, orders), kafka.read_topic(kafka_bootstrap, customers)
    assert len(left_msgs) + len(right_msgs) == N
    driver = TopologyTestDriver(apps.reliability_topology())
    with driver:
        pipe_messages(driver, left_msgs + right_msgs)
        want = driver_store_bytes(driver, TABLES)
        want_out = {j: final_table_values(driver.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()))
                    for j, t in outs["A"].items()}
    dirs_a = latest_task_dirs([state["A"] / app["A"]])
    dirs_b = latest_task_dirs([state[w] / app["B"] for w in ("B0", "B1", "B2")])
    assert sorted(dirs_a) == sorted(dirs_b) and len(dirs_a) == 3 * PARTS
    last_owner = {w: sum(str(d).startswith(str(state[w])) for d in dirs_b.values()) for w in ("B0", "B1", "B2")}
    got = {"A": task_store_bytes(dirs_a.values(), TABLES), "B": task_store_bytes(dirs_b.values(), TABLES)}
    ts_differences = {}
    for s in TABLES:
        if s == "enriched":
            values = {r: {k: v[8:] for k, v in got[r][s].items()} for r in got}
            assert values["A"] == {k: v[8:] for k, v in want[s].items()}, s
            assert values["B"] == values["A"], s
            ts_differences = {r: sum(got[r][s][k][:8] != want[s][k][:8] for k in want[s]) for r in got}
            ts_differences["B vs A"] = sum(got["B"][s][k][:8] != got["A"][s][k][:8] for k in want[s])
        else:
            assert got["A"][s] == want[s], (s, len(got["A"][s]), len(want[s]))
            assert got["B"][s] == got["A"][s], (s, len(got["B"][s]), len(got["A"][s]))
    python_totals = order_totals(left_msgs)
    totals = {k.decode(): json.loads(v[8:]) for k, v in got["B"]["totals"].items()}
    assert {k: t for k, t in totals.items() if t["orders"]} == python_totals

    # the outputs: B's final tables == A's == the driver's
    sizes = {}
    for j in ("enriched", "totals"):
        msgs = {r: kafka.read_topic(kafka_bootstrap, outs[r][j]) for r in app}
        assert final_table(msgs["A"]) == want_out[j], j
        assert final_table(msgs["B"]) == final_table(msgs["A"]), j
        sizes[j] = {r: len(m) for r, m in msgs.items()}

    report(f"{N} interleaved input records ({len(left_msgs)} orders, {len(right_msgs)} customers) on {PARTS}+{PARTS} "
           f"partitions, produced in {produce_s:.1f} s; groups drained after A {drained['A']} s, B {drained['B']} s")
    report(f"run B timeline: {timeline}; B0 assignments: {[len(a) for a in b0_assign]} partitions "
           f"({len(b0_assign) - 1} rebalances seen); task restores logged: B0 {restores_b0}, B1 + B2 "
           f"{restores_scaled_out}")
    for w, (tps, n) in scaled_out.items():
        report(f"{w}: {len(assignments(logs[w]))} assignment(s), {len(tps)} partitions in all, {n} records processed")
    entries = ", ".join(f"{s} ({len(got['B'][s])})" for s in TABLES)
    report(f"B's tasks' last owners: {last_owner}; tables equal A's and the driver's: "
           f"{entries}; join-result timestamps that differ: "
           f"{ts_differences}")
    report(f"output records: {sizes}; final tables of B == A == driver")
