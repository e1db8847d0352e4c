"""Items a backfill run leaves on a cluster are cut into pieces of at most ``item_bytes`` (a JVM
byte array, and PySpark's framing, stop at 2 GiB) and joined again where they are read, whatever
order Spark's shuffle delivers them in (``backfill.task_run``)."""

import random

import pytest

from backfill.items import PIECE, ResultItem, RowsBatch, as_input
from backfill.pieces import in_pieces, join_pieces, split_inputs, to_pieces


def test_small_bytes_stay_whole_and_big_ones_come_back_in_any_order():
    rnd = random.Random(5)
    blob = bytes(rnd.randrange(256) for _ in range(10_007))
    assert to_pieces(blob, 10_007) == [blob]
    pieces = to_pieces(blob, 1000)
    assert len(pieces) == 11 and all(p.marker == PIECE and len(p.data) <= 1000 for p in pieces)
    rnd.shuffle(pieces)
    assert join_pieces(["a", *pieces, b"z"]) == ["a", blob, b"z"]


def test_a_missing_piece_is_an_error():
    pieces = to_pieces(b"x" * 3000, 1000)
    with pytest.raises(RuntimeError, match="1 of 3 pieces"):
        join_pieces(pieces[:2])


def test_a_tasks_inputs_are_joined_and_ordered_by_run():
    state = bytes(range(256)) * 30
    rows = {0: b"r0" * 900, 3: b"r3" * 10, 1: b"r1" * 2000}
    items = in_pieces([ResultItem("state", 2, state)]
                      + [ResultItem("rows", 2, RowsBatch(run, "topic", "0_1", b)) for run, b in rows.items()]
                      + [ResultItem("stats", 2, {})], 1000)
    rows_pieces = [x.payload.blob for x in items if x.kind == "rows"]
    assert sum(isinstance(p, tuple) for p in rows_pieces) == 6 and b"r3" * 10 in rows_pieces
    assert all(len(p.data) <= 1000 for p in rows_pieces if isinstance(p, tuple))
    # as a run's partition receives them (task, input), shuffled, a partition marker first
    inputs = [as_input(x) for x in items if x.kind != "stats"]
    random.Random(1).shuffle(inputs)
    got_state, got_rows = split_inputs([0, *inputs])
    assert got_state == state
    assert [(r.run, r.topic, r.origin, r.blob) for r in got_rows] == [
        (run, "topic", "0_1", rows[run]) for run in (0, 1, 3)]
