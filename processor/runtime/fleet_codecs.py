"""The fleet's group protocol on the wire: what members and the leader exchange (pure).

The group protocol (``processor-fleet``, ``processor/runtime/membership.py``) carries, as user
data, a member's ``Subscription`` (its application server, process, instance, the tasks it runs
and the changelog offset sum of every task it holds state of) and the leader's ``Assignment`` to
each member (its active tasks, standbys, warm-ups, whether a probing rebalance follows, the
fleet's map, or a refusal as a copy). Kafka Streams' ``SubscriptionInfo`` and ``AssignmentInfo``.

Byte layout: one version byte (``VERSION``, 1), then UTF-8 JSON; a task is its text
``"<sub>_<partition>"`` (``processor/engine/task_id.py``). Invariant: any other version is refused
with a ``ValueError`` naming it (never read as this one).

``group_metadata_bytes`` is librdkafka's serialized consumer group metadata, which an
exactly-once commit sends with its offsets (documented beside it).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from processor.engine.task_id import TaskId
from processor.runtime.placement import TaskKey

PROTOCOL = "processor-fleet"

VERSION = 1


def _task_key(t: TaskKey) -> str:
    return str(TaskId(*t))


def _task_of(key: str) -> TaskKey:
    sub, partition = TaskId.parse(key)
    return sub, partition   # (a plain pair, as the rest of the runtime's keys)


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
    "sums": {"<sub>_<partition>": int}, "running": ["<sub>_<partition>", ...],
    "instance": str, "claimed_at": int}]``. ``process``: the worker id of its state directory;
    ``sums``: changelog offset sum of the local state per task (where known); ``running``: the
    tasks it runs as active now (their lag is ``RUNNING``); ``instance`` and ``claimed_at`` (ms):
    the live process claiming the worker id and since when (``worker_identity.py``; optional:
    absent from a worker of an older build, which then is never refused as a copy)."""

    server: str | None
    process: str
    sums: dict[TaskKey, int] = field(default_factory=dict)
    running: list[TaskKey] = field(default_factory=list)
    instance: str | None = None
    claimed_at: int | None = None


def encode_subscription(s: Subscription) -> bytes:
    body: dict[str, Any] = {"server": s.server, "process": s.process,
                            "sums": {_task_key(t): v for t, v in sorted(s.sums.items())},
                            "running": [_task_key(t) for t in sorted(s.running)]}
    if s.instance is not None:
        body["instance"], body["claimed_at"] = s.instance, s.claimed_at
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_subscription(data: bytes) -> Subscription:
    body = json.loads(_check_version(data, "subscription"))
    return Subscription(server=body["server"], process=body["process"],
                        sums={_task_of(k): int(v) for k, v in body["sums"].items()},
                        running=[_task_of(k) for k in body["running"]],
                        instance=body.get("instance"), claimed_at=body.get("claimed_at"))


@dataclass
class Assignment:
    """What the leader tells a member.

    Layout: ``[version u8 = 1][UTF-8 JSON {"active": [...], "standby": [...], "warmup": [...],
    "probing": bool, "fleet": {"host:port": {"active": [...], "standby": [...]}},
    "claimed_by": {"instance": str, "claimed_at": int}}]``, tasks as ``"<sub>_<partition>"``.
    ``fleet``: every member's application server with its tasks, so any worker can answer who
    holds a key's task. ``claimed_by`` (optional): this member is refused, its worker id being
    claimed by that live instance first (invariant 7); it gets no task."""

    active: list[TaskKey] = field(default_factory=list)
    standby: list[TaskKey] = field(default_factory=list)
    warmup: list[TaskKey] = field(default_factory=list)
    probing: bool = False
    fleet: dict[str, dict[str, list[TaskKey]]] = field(default_factory=dict)
    claimed_by: tuple[str, int | None] | None = None


def encode_assignment(a: Assignment) -> bytes:
    body: dict[str, Any] = {
        "active": [_task_key(t) for t in a.active], "standby": [_task_key(t) for t in a.standby],
        "warmup": [_task_key(t) for t in a.warmup], "probing": a.probing,
        "fleet": {srv: {k: [_task_key(t) for t in v] for k, v in roles.items()}
                  for srv, roles in sorted(a.fleet.items())}}
    if a.claimed_by is not None:
        body["claimed_by"] = {"instance": a.claimed_by[0], "claimed_at": a.claimed_by[1]}
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_assignment(data: bytes) -> Assignment:
    body = json.loads(_check_version(data, "assignment"))
    claimed = body.get("claimed_by")
    return Assignment(active=[_task_of(k) for k in body["active"]],
                      standby=[_task_of(k) for k in body["standby"]],
                      warmup=[_task_of(k) for k in body["warmup"]], probing=bool(body["probing"]),
                      fleet={srv: {k: [_task_of(x) for x in v] for k, v in roles.items()}
                             for srv, roles in body["fleet"].items()},
                      claimed_by=None if claimed is None else (claimed["instance"], claimed.get("claimed_at")))


def group_metadata_bytes(group: str, generation: int, member_id: str, group_instance_id: str | None = None) -> bytes:
    """librdkafka's serialized consumer group metadata (rd_kafka_consumer_group_metadata_write):
    ``b"CGMDv2:"``, native int32 generation, NUL-terminated group id, NUL-terminated member id,
    then ``0x01`` (no group instance id) or ``0x00`` and the NUL-terminated group instance id (a
    static member: Kafka checks a transactional offset commit's instance id against the group's,
    and fences a replaced one). Internal format: tests compare it with confluent-kafka's own, for
    (-1, "") and for a static member that joined a group."""
    head = b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member_id.encode() + b"\0"
    if group_instance_id is None:
        return head + b"\x01"
    return head + b"\x00" + group_instance_id.encode() + b"\0"
