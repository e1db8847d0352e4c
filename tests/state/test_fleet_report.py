"""What a fleet member reports to the group's leader (``processor/runtime/fleet.py``, invariant 2):
the changelog offset sum of every task it holds state of, on real RocksDB directories. A standby
copy the assignment drops stays on disk, and is reported as far as its checkpoint reaches: a task
about to move here (withheld for a round while its owner revokes it, the warm-up copy closed
meanwhile) must not count as having no state here, or the leader sends it back to its old owner
and warms up a copy here again, round after round (seen on Apache Kafka: a 10 s ping-pong of one
task between two workers after a SIGKILL)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from processor.runtime.fleet import WorkerFleet
from processor.runtime.fleet_assignor import FleetRules
from processor.runtime.fleet_codecs import Assignment, Subscription
from processor.runtime.standby import StandbyTasks
from tests.state.test_task_owner import APP, fill


def _fleet(state) -> WorkerFleet:
    """A ``WorkerFleet`` without its group client: the report and the standbys only."""
    fleet = WorkerFleet.__new__(WorkerFleet)
    fleet.worker = SimpleNamespace(task_manager=SimpleNamespace(tasks={}, restoring=[], offset_sums=dict), fleet_map={})
    fleet.rules = FleetRules(partitions_of_task={(0, p): [("events", p)] for p in range(3)},
                             stateful={(0, p) for p in range(3)})
    fleet.standby = StandbyTasks(APP, state, {}, threading.Event())
    fleet.assignment = None
    fleet.generation = -1
    fleet.rebalances = 0
    fleet._standby_due = False
    fleet._probe_at = None
    fleet._last_probe = 0.0
    fleet._reported_at = time.monotonic()
    fleet._closed_sums = {}
    fleet._report = Subscription(server=None, process="p")
    return fleet


def test_a_dropped_standby_is_still_reported(tmp_path):
    state = tmp_path / "orders"
    fill(state / "task-0_1", {b"a": b"1"}, {("orders-counts-changelog", 1): 5, ("events", 1): 9})
    fleet = _fleet(state)
    try:
        fleet.on_assignment(Assignment(standby=[(0, 1)], warmup=[(0, 1)]), 6)
        fleet._apply_standbys()
        assert fleet.standby.keys == {(0, 1)}
        assert fleet.report().sums == {(0, 1): 5}
        # the next round places the task here, but withholds it while its owner revokes it:
        # no standby of it here for a round
        fleet.on_assignment(Assignment(standby=[(0, 2)]), 7)
        fleet._apply_standbys()
        assert fleet.standby.keys == {(0, 2)}
        assert fleet.report().sums == {(0, 1): 5, (0, 2): 0}
        assert fleet.report().running == []
    finally:
        fleet.standby.close()
