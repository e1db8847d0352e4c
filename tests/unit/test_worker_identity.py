"""A worker's identity (processor/runtime/worker_identity.py) and the leader's refusal of a copied
state directory (fleet_assignor.py invariant 5), on real files and the pure assignor."""

import os
import socket
import stat
import time

import pytest

from processor.errors import StateDirUnusable
from processor.runtime.fleet_assignor import FleetRules, assign_fleet, copies_of
from processor.runtime.fleet_codecs import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from processor.runtime.state_lock import StateDirLock
from processor.runtime.worker_identity import ID_RULE, is_gone, on_this_host, process_instance, worker_id


def test_a_new_worker_id_is_written_whole_and_readable_by_its_owner_only(tmp_path):
    state = tmp_path / "s" / "app"
    first = worker_id(state)
    assert ID_RULE.fullmatch(first) and worker_id(state) == first
    assert stat.S_IMODE((state / "worker.id").stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert [p.name for p in state.iterdir()] == ["worker.id"]   # no temporary file left behind


def test_a_new_state_directory_is_owner_only_and_an_existing_one_keeps_its_mode(tmp_path):
    new = tmp_path / "new" / "app"
    lock = StateDirLock(new).acquire()
    try:
        assert stat.S_IMODE(new.stat().st_mode) == 0o700
        assert stat.S_IMODE((new / ".lock").stat().st_mode) == 0o600
    finally:
        lock.release()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o750)   # its owner's choice (a sidecar of the group reads it)
    lock = StateDirLock(shared).acquire()
    try:
        assert stat.S_IMODE(shared.stat().st_mode) == 0o750
    finally:
        lock.release()


@pytest.mark.parametrize("content", [b"", b"\n", b"\xff\xfe\x00binary", b"x" * 65, b"-leading-dash",
                                     b"has space", b"a/../b"])
def test_a_broken_worker_id_is_one_line_naming_the_file(tmp_path, content):
    state = tmp_path / "app"
    state.mkdir()
    (state / "worker.id").write_bytes(content)
    with pytest.raises(StateDirUnusable) as exc:
        worker_id(state)
    text = str(exc.value)
    assert str(state / "worker.id") in text and "delete the file" in text and "\n" not in text
    assert exc.value.exit_code == 4


def test_subscriptions_and_assignments_carry_the_instance_and_the_refusal():
    s = Subscription(server="h:1", process="w1", sums={(0, 1): 5}, running=[(0, 1)], instance="1@h#ab",
                     claimed_at=123)
    assert decode_subscription(encode_subscription(s)) == s
    old = Subscription(server=None, process="w1")   # an older build's: no instance
    assert b"instance" not in encode_subscription(old) and decode_subscription(encode_subscription(old)) == old
    a = Assignment(active=[], claimed_by=("1@h#ab", 123))
    assert decode_assignment(encode_assignment(a)) == a
    assert b"claimed_by" not in encode_assignment(Assignment())


def test_the_leader_refuses_every_copy_but_the_first_claim_and_places_the_others():
    rules = FleetRules(partitions_of_task={(0, p): [("in", p)] for p in range(4)}, stateful=set())
    subs = {
        "m-original": Subscription(server="a:1", process="w1", instance="10@a#1", claimed_at=100),
        "m-copy": Subscription(server="b:1", process="w1", instance="20@b#2", claimed_at=200),
        "m-thread": Subscription(server="a:1", process="w1", instance="10@a#1", claimed_at=100),
        "m-other": Subscription(server="c:1", process="w2", instance="30@c#3", claimed_at=50),
        "m-old-build": Subscription(server="d:1", process="w3"),
    }
    assert set(copies_of(subs)) == {"m-copy"}
    out = assign_fleet(rules, subs, {})
    assert out["m-copy"].claimed_by == ("10@a#1", 100) and out["m-copy"].active == []
    assert sorted(t for m, a in out.items() for t in a.active) == [(0, p) for p in range(4)]
    assert all(a.claimed_by is None for m, a in out.items() if m != "m-copy")
    assert "b:1" not in out["m-original"].fleet


def test_the_process_instance_is_one_per_process():
    a, since = process_instance()
    assert process_instance() == (a, since) and a.startswith(f"{os.getpid()}.")
    assert on_this_host(a) and is_gone(a)   # (this very pid: an earlier incarnation's report)


def test_a_report_of_a_process_is_gone_when_its_pid_runs_another_process_or_none():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        from processor.runtime.worker_identity import _started
        started = _started(child.pid)
        host = socket.gethostname()
        assert started is not None
        assert not is_gone(f"{child.pid}.{started}@{host}#ab")            # running: a live claim
        assert is_gone(f"{child.pid}.{int(started) - 1}@{host}#ab")       # the pid reused since
        assert not is_gone(f"{child.pid}.{started}@another-host#ab")      # another host: not known here
        assert not is_gone("garbage") and not on_this_host("garbage")
        child.kill()   # exited, not yet reaped: a zombie is gone too
        deadline = time.monotonic() + 10
        while not is_gone(f"{child.pid}.{started}@{host}#ab"):
            assert time.monotonic() < deadline, "a killed, unreaped child still counts as live"
            time.sleep(0.01)
        assert os.path.exists(f"/proc/{child.pid}")   # (still there, as a zombie)
    finally:
        child.kill()
        child.wait()
    assert is_gone(f"{child.pid}.{started}@{host}#ab")                    # exited and reaped


def _create_at_once(state, n: int) -> tuple[list[str], list[Exception]]:
    import threading

    got: list[str] = []
    errors: list[Exception] = []
    barrier = threading.Barrier(n)

    def create():
        barrier.wait()
        try:
            got.append(worker_id(state))
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, errors


def test_workers_creating_the_id_at_once_all_get_the_same_one(tmp_path):
    for attempt in range(20):   # (threads of one process, as workers in threads start)
        state = tmp_path / f"s{attempt}" / "app"
        got, errors = _create_at_once(state, 4)
        assert errors == [] and len(set(got)) == 1 and len(got) == 4
        assert [p.name for p in state.iterdir()] == ["worker.id"]
