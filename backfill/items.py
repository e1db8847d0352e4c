"""The work items of a backfill run: what a task yields, what reaches a task of a later run, and
the pieces big bytes travel in.

- ``ResultItem(kind, partition, payload)``: one item of a run's result (``backfill.task_run``
  yields them, ``backfill.runs`` keeps them as Spark data): ``"stats"`` (a dict), ``"state"`` (a
  task's stores for its next run, bytes), ``"rows"`` (a ``RowsBatch`` for destination partition
  ``partition``), ``"output"`` (Arrow IPC bytes) or ``"db"`` (a task database's bytes).
- A task of a later run receives ``(task, ResultItem)`` pairs (``as_input``), a ``"state"`` or
  ``"rows"`` item of an earlier result addressed to it; ``(task, None)`` marks a partition.
- ``RowsBatch(run, topic, origin, blob)``: the internal rows one origin task sent to one
  partition of ``topic`` in ``run``, pickled in send order.
- ``TaskStats``: the payload of a ``"stats"`` item (a dict).
- ``RunRecord(sub_topology, flush, records, seconds)``: a run as the job's report lists it.
- ``Piece(marker, group, number, total, data)``: bytes larger than ``JobContext.item_bytes`` travel
  as ``total`` numbered pieces of one ``group`` and are joined again where they are read
  (``backfill.pieces.join_pieces``); the bytes of a ``"state"``, ``"db"`` item or of a
  ``RowsBatch`` may be a piece.

Invariant: items are read by their fields (and a piece by ``is_piece``), never by their class: with
``PYSPARK_ENABLE_NAMEDTUPLE_PATCH=1`` PySpark pickles a named tuple by value, and it comes back as
an instance of a class of the same name and fields made anew.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

PIECE = "~piece"


class Piece(NamedTuple):
    """Piece ``number`` (from 0) of ``total`` of bytes too big for one item."""
    marker: str        # PIECE
    group: str         # the id the pieces of the same bytes share
    number: int
    total: int
    data: bytes


class RowsBatch(NamedTuple):
    """Internal rows one task sent to one partition of an internal topic in one run."""
    run: int
    topic: str
    origin: str                # the sending task, "<sub>_<partition>"
    blob: bytes | Piece        # the pickled rows, in send order


class ResultItem(NamedTuple):
    """One item of a run's result."""
    kind: str          # "stats", "state", "rows", "output" or "db"
    partition: int     # the task's partition; for "rows" the destination partition
    payload: Any       # dict (stats), bytes or Piece (state, db), RowsBatch (rows), bytes (output)


class TaskStats(TypedDict, total=False):
    """The payload of a ``"stats"`` item: what a task's run (``TaskRun``) or final write
    (``FinalizeTask``) reports to the driver; a task that failed on purpose reports ``error``
    only (``context.raise_task_errors``)."""
    error: dict                    # context.error_info
    task: str                      # "<sub>_<partition>"
    records: int                   # records processed (input and internal)
    read: int                      # input rows read
    replayed: int                  # of those, processed (after compaction)
    internal: dict[str, int]       # internal topic -> rows sent
    superseded: int                # foreign-key join records superseded (not sent)
    dead_lettered: int
    failed: dict[str, int]         # input topic -> records failed in processing
    entries: dict[str, int]        # store -> entries written (the task's last run or final write)
    unordered: list[str]           # reduced partitions replayed whole
    outputs: int                   # "output" items
    build: str                     # the executor's build of the per-record path (processor._compiled)
    built: int                     # databases built by the task (a local master)
    db: int                        # bytes of its database item
    seconds: dict[str, float]      # phase -> seconds


class RunRecord(NamedTuple):
    """A run as the report lists it (``BackfillReport.runs``)."""
    sub_topology: int
    flush: bool        # the sub-topology's flush (a graceful stop's emissions)
    records: int       # records its tasks processed
    seconds: float


def as_input(item: ResultItem) -> tuple[int, ResultItem]:
    """A result item -> ``(task, item)``: the pair a later run's shuffle routes to task ``task``."""
    return item.partition, item


def is_piece(value: object) -> bool:
    """Whether ``value`` (bytes, or a value of ``join_pieces``'s list) is a ``Piece``."""
    return isinstance(value, tuple) and getattr(value, "marker", None) == PIECE
