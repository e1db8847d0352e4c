"""Fleet membership (issue 36, step 2): the codecs and the leader's computation (pure part).

The group protocol runs through kafka-python with our assignor (protocol ``processor-fleet``);
this module holds what that assignor exchanges and computes, independent of any broker.

Invariants:

1. **Versioned user data.** Subscription and assignment user data start with a version byte
   (``1``); any other version is refused with a ``ValueError`` naming it.
2. **Lags from reported sums.** A member's lag for a task = the highest changelog offset sum any
   member reported for it (the running owner's included) minus its own; ``RUNNING`` stays
   ``RUNNING``; a task the member reports nothing for is absent (no state).
3. **Two-phase moves (KIP-429).** A task whose partitions another member reported in
   ``owned_partitions`` this round is not given to its new member in this generation: it stays
   unassigned, its owner revokes it, and the follow-up rebalance gives it over.

Not yet here (see the branch's report): ``FleetAssignor`` (kafka-python glue) and
``FleetMembership``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from processor.runtime.placement import RUNNING, TaskId

VERSION = 1


def _task_key(t: TaskId) -> str:
    return f"{t[0]}_{t[1]}"


def _task_of(key: str) -> TaskId:
    a, b = key.split("_")
    return int(a), int(b)


def _check_version(data: bytes, what: str) -> bytes:
    if not data:
        raise ValueError(f"{what} user data is empty (expected version byte {VERSION})")
    if data[0] != VERSION:
        raise ValueError(f"{what} user data has version {data[0]}, this worker reads only version {VERSION}")
    return data[1:]


@dataclass
class Subscription:
    """What a member reports.

    Layout: ``[version u8 = 1][UTF-8 JSON {"server": "host:port"|null, "process": str,
    "sums": {"<sub>_<partition>": int}, "running": ["<sub>_<partition>", ...]}]``.
    ``sums``: changelog offset sum of the local state per task (where known); ``running``: the
    tasks it runs as active now (their lag is ``RUNNING``)."""

    server: str | None
    process: str
    sums: dict[TaskId, int] = field(default_factory=dict)
    running: list[TaskId] = field(default_factory=list)


def encode_subscription(s: Subscription) -> bytes:
    body = {"server": s.server, "process": s.process,
            "sums": {_task_key(t): v for t, v in sorted(s.sums.items())},
            "running": [_task_key(t) for t in sorted(s.running)]}
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_subscription(data: bytes) -> Subscription:
    body = json.loads(_check_version(data, "subscription"))
    return Subscription(server=body["server"], process=body["process"],
                        sums={_task_of(k): int(v) for k, v in body["sums"].items()},
                        running=[_task_of(k) for k in body["running"]])


@dataclass
class Assignment:
    """What the leader tells a member.

    Layout: ``[version u8 = 1][UTF-8 JSON {"active": [...], "standby": [...], "warmup": [...],
    "probing": bool, "fleet": {"host:port": {"active": [...], "standby": [...]}}}]``, tasks as
    ``"<sub>_<partition>"``. ``fleet``: every member's application server with its tasks, so any
    worker can answer who holds a key's task."""

    active: list[TaskId] = field(default_factory=list)
    standby: list[TaskId] = field(default_factory=list)
    warmup: list[TaskId] = field(default_factory=list)
    probing: bool = False
    fleet: dict[str, dict[str, list[TaskId]]] = field(default_factory=dict)


def encode_assignment(a: Assignment) -> bytes:
    body = {"active": [_task_key(t) for t in a.active], "standby": [_task_key(t) for t in a.standby],
            "warmup": [_task_key(t) for t in a.warmup], "probing": a.probing,
            "fleet": {srv: {k: [_task_key(t) for t in v] for k, v in roles.items()}
                      for srv, roles in sorted(a.fleet.items())}}
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_assignment(data: bytes) -> Assignment:
    body = json.loads(_check_version(data, "assignment"))
    return Assignment(active=[_task_of(k) for k in body["active"]],
                      standby=[_task_of(k) for k in body["standby"]],
                      warmup=[_task_of(k) for k in body["warmup"]], probing=bool(body["probing"]),
                      fleet={srv: {k: [_task_of(x) for x in v] for k, v in roles.items()}
                             for srv, roles in body["fleet"].items()})


def lags_of(subs: Mapping[str, Subscription]) -> dict[str, dict[TaskId, int]]:
    """``member -> {task: lag}`` from the reported offset sums (invariant 2)."""
    top: dict[TaskId, int] = {}
    for s in subs.values():
        for t, v in s.sums.items():
            top[t] = max(top.get(t, v), v)
    out: dict[str, dict[TaskId, int]] = {}
    for m, s in subs.items():
        lag = {t: top[t] - v for t, v in s.sums.items()}
        for t in s.running:
            lag[t] = RUNNING
        out[m] = lag
    return out


def withhold_moving(active: Mapping[str, list[TaskId]], owned: Mapping[str, Iterable[tuple[str, int]]],
                    partitions_of_task: Mapping[TaskId, Iterable[tuple[str, int]]]) -> dict[str, list[TaskId]]:
    """The active tasks each member gets this generation (invariant 3): a task with a partition
    another member reported owning is withheld."""
    owner_of = {tp: m for m, tps in owned.items() for tp in tps}
    out: dict[str, list[TaskId]] = {}
    for m, ts in active.items():
        out[m] = [t for t in ts if all(owner_of.get(tp, m) == m for tp in partitions_of_task.get(t, ()))]
    return out


def group_metadata_bytes(group: str, generation: int, member_id: str) -> bytes:
    """librdkafka's serialized consumer group metadata (rd_kafka_consumer_group_metadata_write):
    ``b"CGMDv2:"``, native int32 generation, NUL-terminated group id, NUL-terminated member id,
    then ``0x01`` (no group instance id). Internal format: a test compares it with
    confluent-kafka's own for (-1, "")."""
    return (b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member_id.encode()
            + b"\0" + b"\x01")
