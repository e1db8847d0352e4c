"""Both ways a backfill task's pieces travel (``backfill.passage``: Spark data on a cluster, files
under the build root on a local master) hand a task's next run the same inputs: the stores it
left, and the rows earlier runs addressed to it, in run order, only of the runs and topics asked
for. On a cluster the pieces are routed as the runs' shuffle routes them (``as_input``)."""

import random

import pytest

from backfill.items import ResultItem, RowsBatch, as_input
from backfill.passage import LocalFiles, SparkItems

STATE = bytes(range(256)) * 20


def left_by_runs():
    """What tasks of sub-topology 0 left in runs 0-2: (run, task id, items)."""
    return [
        (0, "0_1", [ResultItem("state", 1, STATE),
                    ResultItem("rows", 1, RowsBatch(0, "rep", "0_1", b"r0-to-1" * 300)),
                    ResultItem("rows", 0, RowsBatch(0, "rep", "0_1", b"r0-to-0")),
                    ResultItem("output", 1, b"out")]),
        (1, "1_0", [ResultItem("rows", 1, RowsBatch(1, "other", "1_0", b"other-topic"))]),
        (2, "1_0", [ResultItem("rows", 1, RowsBatch(2, "rep", "1_0", b"r2-to-1"))]),
    ]


def spark_inputs(passage, partition, pending, reads):
    yielded = [item for run, task, out in left_by_runs() for item in passage.keep(run, task, out)]
    # the state of task 1's sub-topology and the pending runs' rows, routed to their partition
    # as the next run's shuffle does, a partition marker among them, in any order
    pairs = [as_input(x) for x in yielded
             if x.kind == "state" or (x.kind == "rows" and x.payload.run in pending and x.payload.topic in reads)]
    pairs = [p for p in pairs if p[0] == partition] + [(partition, None)]
    random.Random(3).shuffle(pairs)
    return passage.task_inputs(0, partition, pending, reads, pairs)


def local_inputs(tmp_path, partition, pending, reads):
    passage = LocalFiles(str(tmp_path))
    for run, task, out in left_by_runs():
        assert passage.keep(run, task, out) == []   # a local master's task yields its stats only
    return passage.task_inputs(0, partition, pending, reads, [partition])


@pytest.mark.parametrize("pending, reads", [([0, 2], ["rep"]), ([2], ["rep"]), ([0, 1, 2], ["rep", "other"])])
def test_both_passages_give_a_task_the_same_inputs(tmp_path, pending, reads):
    cluster = spark_inputs(SparkItems(item_bytes=500), 1, pending, reads)   # (the state in 11 pieces)
    local = local_inputs(tmp_path, 1, pending, reads)
    assert cluster == local
    state, rows = cluster
    assert state == STATE
    expected = [b for run, b in [(0, b"r0-to-1" * 300), (1, b"other-topic"), (2, b"r2-to-1")]
                if run in pending and (run != 1 or "other" in reads)]
    assert [r.blob for r in rows] == expected


def test_a_task_with_nothing_left_gets_no_state(tmp_path):
    assert spark_inputs(SparkItems(item_bytes=500), 0, [0], ["rep"]) == local_inputs(tmp_path, 0, [0], ["rep"])
    state, rows = local_inputs(tmp_path / "again", 0, [0], ["rep"])
    assert state is None and [r.blob for r in rows] == [b"r0-to-0"]


def test_a_database_item_on_a_local_master_is_an_internal_error(tmp_path):
    with pytest.raises(RuntimeError, match="'db' item on a local master"):
        LocalFiles(str(tmp_path)).keep(0, "0_0", [ResultItem("db", 0, b"x")])


def test_a_task_runs_outputs_in_several_items_are_all_kept_in_order(tmp_path):
    # (a task run's outputs come in items of about item_bytes each: RowCollector.items)
    files = LocalFiles(str(tmp_path))
    blobs = [f"part {i}".encode() for i in range(12)]
    files.keep(3, "0_1", [ResultItem("output", 1, b) for b in blobs])
    files.keep(3, "0_0", [ResultItem("output", 0, b"other task")])
    assert files.read_outputs() == [b"other task", *blobs]
