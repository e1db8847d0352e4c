"""Big payloads in pieces: no item Spark carries holds more than ``JobContext.item_bytes`` (a JVM
byte array and PySpark's framing stop at 2 GiB); bigger bytes travel as numbered ``Piece``s
(``backfill.items``) and are joined again where they arrive. Invariant: a set of pieces with one
missing is an error, never a shorter payload."""

from __future__ import annotations

from backfill.items import PIECE, Piece, ResultItem, RowsBatch, is_piece

# -- pieces: no item Spark carries holds more than ``JobContext.item_bytes`` (a JVM byte array and
# PySpark's framing stop at 2 GiB): bigger bytes travel as numbered pieces and are joined again

def to_pieces(blob: bytes, limit: int) -> list:
    """``blob`` itself, or ``Piece``s of at most ``limit`` bytes."""
    if len(blob) <= limit:
        return [blob]
    import uuid

    gid = uuid.uuid4().hex
    n = -(-len(blob) // limit)
    return [Piece(PIECE, gid, i, n, blob[i * limit:(i + 1) * limit]) for i in range(n)]


def join_pieces(values: list) -> list:
    """``values`` with every complete set of pieces joined into its bytes (in first-seen order);
    a set with a piece missing is an error."""
    out: list = []
    groups: dict[str, dict[int, Piece]] = {}
    order: list[int] = []
    for v in values:
        if is_piece(v):
            if v.group not in groups:
                groups[v.group] = {}
                order.append(len(out))
                out.append(v.group)
            groups[v.group][v.number] = v
        else:
            out.append(v)
    for i in order:
        parts = groups[out[i]]
        n = next(iter(parts.values())).total
        if len(parts) != n:
            raise RuntimeError(f"backfill: internal error: {n - len(parts)} of {n} pieces of an item missing")
        out[i] = b"".join(parts[k].data for k in range(n))
    return out


def in_pieces(items: list[ResultItem], limit: int) -> list[ResultItem]:
    """A run's result items with every big bytes payload (a task's stores, a database, a rows
    list) cut into pieces."""
    out: list[ResultItem] = []
    for item in items:
        if item.kind in ("state", "db"):
            out.extend(item._replace(payload=p) for p in to_pieces(item.payload, limit))
        elif item.kind == "rows":
            batch = item.payload
            out.extend(item._replace(payload=batch._replace(blob=p)) for p in to_pieces(batch.blob, limit))
        else:
            out.append(item)
    return out


def split_inputs(items) -> tuple[bytes | None, list[RowsBatch]]:
    """A run's partition (``(task, ResultItem)`` pairs) -> (the task's state bytes, its rows
    batches sorted by run), pieces joined."""
    states = []
    rows: dict[tuple[int, str, str], list] = {}
    for pair in items:
        if not isinstance(pair, tuple):
            continue            # a partition marker (range of task numbers)
        _, item = pair
        if item is None:
            continue
        if item.kind == "state":
            states.append(item.payload)
        else:
            batch = item.payload
            rows.setdefault((batch.run, batch.topic, batch.origin), []).append(batch.blob)
    state = join_pieces(states)
    if len(state) > 1:
        raise RuntimeError(f"backfill: internal error: {len(state)} stores for one task")
    joined = [RowsBatch(run, topic, origin, b) for (run, topic, origin), blobs in rows.items()
              for b in join_pieces(blobs)]
    joined.sort(key=lambda batch: batch.run)
    return (state[0] if state else None), joined
