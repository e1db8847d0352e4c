"""Static membership (issue 14 item 6): with ``--static-membership`` a worker joins as
``group.instance.id = <application id>-<worker id>``, the worker id kept in its state directory,
so a restarted worker is the same member. Per guarantee of the broker (probed here by timing it,
reported by name): a static member SIGKILLed and restarted at once rejoins without waiting for
its old session to expire. What must hold on any broker: the id is the same after the restart,
the restarted worker gets every partition back, and the output is exact.
"""

import json
import re
import signal
import time

from processor.kafka import clients as kafka
from tests.integration import apps
from tests.integration.helpers import (
    final_table,
    kill_leftover_workers,
    produce,
    start_worker_process,
    stop_workers,
    wait_until_tasks_committed,
)

PARTS = 2
SPEC = "tests.integration.apps:restore_topology"


def _assignments(log):
    return [float(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))) + int(m.group(2)) / 1000
            for m in re.finditer(r"^(\S+ \S+),(\d+) INFO processor\.worker: assigned", open(log).read(), re.M)]


def _kill_and_rejoin(bootstrap, app, state, log, env, static: bool) -> float:
    """Start, wait for the assignment, SIGKILL, restart at once: seconds from the restart to the
    second assignment."""
    extra = ["--static-membership"] if static else []
    p = start_worker_process(bootstrap, SPEC, app, state, log, env, extra_args=extra)
    try:
        deadline = time.monotonic() + 60
        while len(_assignments(log)) < 1:
            assert p.poll() is None and time.monotonic() < deadline, open(log).read()[-3000:]
            time.sleep(0.1)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        restarted = time.time()
        p = start_worker_process(bootstrap, SPEC, app, state, log, env, extra_args=extra)
        deadline = time.monotonic() + 60
        while len(_assignments(log)) < 2:
            assert p.poll() is None and time.monotonic() < deadline, open(log).read()[-3000:]
            time.sleep(0.1)
        rejoin_s = _assignments(log)[1] - restarted
        topo = apps.restore_topology().for_application(app)

        def alive():
            assert p.poll() is None, open(log).read()[-3000:]
        wait_until_tasks_committed(bootstrap, topo, {env["APP_INPUT"]: PARTS}, "read_uncommitted", timeout_s=120,
                                   check=alive)
        stop_workers([p], [log])
        return rejoin_s
    finally:
        kill_leftover_workers([p])


def test_static_member_restarted_keeps_its_id_and_its_partitions(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                 report):
    times = {}
    for static in (True, False):
        inp, out, app = f"in-{unique}-{static}", f"out-{unique}-{static}", f"static-{unique}-{static}"
        env = {"APP_INPUT": inp, "APP_OUTPUT": out}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
        records = [(f"k{i % 500}".encode(), json.dumps({"i": i}).encode()) for i in range(5_000)]
        produce(kafka_bootstrap, inp, records)
        log = tmp_path / f"w-{static}.log"
        times[static] = _kill_and_rejoin(kafka_bootstrap, app, tmp_path / f"state-{static}", log, env, static)
        text = open(log).read()
        ids = re.findall(r"static member of group \S+: group.instance.id=(\S+)", text)
        if static:
            worker_id = (tmp_path / f"state-{static}" / app / "worker.id").read_text().strip()
            assert ids == [f"{app}-{worker_id}"] * 2, ids      # the same member after the restart
        else:
            assert ids == []
        assigned = re.findall(r"processor\.worker: assigned (.*)", text)
        assert len(re.findall(r"\[(\d+)\]@", assigned[-1])) == PARTS, assigned   # every partition back
        want = {}
        for k, v in records:
            want[k] = v
        assert final_table(kafka.read_topic(kafka_bootstrap, out)) == want
    report(f"static_membership rejoin after SIGKILL + immediate restart: {times[True]:.1f} s as a static member, "
           f"{times[False]:.1f} s as a dynamic one (this broker: "
           f"{'faster' if times[True] < times[False] - 1.0 else 'no faster'})")


def test_a_static_members_transactional_commits_carry_its_instance_id(apache_kafka_bootstrap, unique):
    """The group metadata an exactly-once commit sends (``group_metadata_bytes``) is librdkafka's
    own for a static member that joined a group: generation, member id AND group instance id
    (Kafka checks a transactional offset commit's instance id against the group's)."""
    from confluent_kafka import Consumer

    from processor.runtime.fleet_codecs import group_metadata_bytes

    kafka_bootstrap = apache_kafka_bootstrap   # (Apache Kafka's static members, whatever the run's broker)
    topic, group, instance = f"static-meta-{unique}", f"static-meta-{unique}", f"inst-{unique}"
    kafka.create_topics(kafka_bootstrap, {topic: 1})
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "group.instance.id": instance,
                  "session.timeout.ms": 6000})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while not c.assignment():
            assert time.monotonic() < deadline, "the static member was never assigned"
            c.poll(0.2)
        theirs = c.consumer_group_metadata()
        generation = int.from_bytes(theirs[7:11], "little", signed=True)
        assert generation >= 1
        assert theirs == group_metadata_bytes(group, generation, c.memberid(), instance)
        assert group_metadata_bytes(group, generation, c.memberid()) != theirs   # (without it: another member)
    finally:
        c.close()
