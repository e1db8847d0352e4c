"""Who holds a key (``StoreView.metadata``, ``processor/runtime/interactive_queries.py``): a real
topology on a real (not running) Worker whose partitioners and partition counts are set as its
startup check sets them, and a fleet map built by hand as the group's assignment would give it.

The topology: a table of accounts (store ``accounts``, sub-topology 0) whose topic is placed by
confluent-kafka's default partitioner (CRC32), counted per region (store ``by-region``,
sub-topology 1, reading a repartition topic placed by murmur2), and a global table
(``products``). The expected partitions are computed independently (``zlib.crc32``) or pinned.
"""

from __future__ import annotations

import threading
import zlib

import pytest

from processor import StreamsBuilder
from processor.engine.partitioners import CONSISTENT
from processor.engine.routing import PartitionerChoice, Routing
from processor.runtime.interactive_queries import KeyQueryMetadata, NoSuchStore, task_holders
from processor.runtime.worker import Worker
from processor.serde import Serdes

PARTS = 4
ACCOUNTS = ["alice", "bob", "carol", "dave", "erin", "frank"]
REGIONS = ["north", "south", "east", "west"]


def _topology():
    b = StreamsBuilder()
    accounts = b.table("accounts", key_serde=Serdes.string(), value_serde=Serdes.json(), store_name="accounts",
                       partitioner="consistent_random")
    accounts.group_by(lambda k, v: (v["region"], v), key_serde=Serdes.string(),
                      value_serde=Serdes.json()).count(name="by-region")
    b.global_table("products", key_serde=Serdes.string(), value_serde=Serdes.json(), name="products")
    return b.build()


@pytest.fixture
def worker(tmp_path):
    """A Worker as its startup check leaves it (partitioners, partition counts), never started;
    the test's thread stands for its main loop (so queries run at once)."""
    w = Worker(_topology(), "127.0.0.1:1", "iq-meta", tmp_path)
    parts = {"accounts": PARTS, "iq-meta-by-region-repartition": PARTS, "products": 2}
    w.routing = Routing({"accounts": PartitionerChoice("accounts", CONSISTENT, "declared")}, parts)
    w.partition_counts = parts
    w.queries.loop_thread = threading.current_thread()
    return w


FLEET = {
    "a:1": {"active": [(0, 0), (0, 1), (1, 2)], "standby": [(0, 3), (1, 3)]},
    "b:2": {"active": [(0, 2), (1, 0), (1, 3)], "standby": [(0, 0), (0, 1), (1, 2)]},
    "c:3": {"active": [(1, 1)], "standby": [(0, 0), (0, 2), (1, 0)]},
}   # task 0_3 has no active (a member left; the next assignment is not in yet)


def test_a_key_is_placed_by_its_topics_partitioner_and_held_by_the_fleet_maps_servers(worker):
    worker.application_server = "a:1"
    worker.fleet_map = FLEET
    got = [worker.store("accounts").metadata(k) for k in ACCOUNTS]
    assert [m.partition for m in got] == [zlib.crc32(k.encode()) % PARTS for k in ACCOUNTS] == [3, 0, 3, 0, 2, 1]
    assert got == [
        KeyQueryMetadata(None, ["a:1"], 3, "0_3"),             # no active: a standby only
        KeyQueryMetadata("a:1", ["b:2", "c:3"], 0, "0_0"),
        KeyQueryMetadata(None, ["a:1"], 3, "0_3"),
        KeyQueryMetadata("a:1", ["b:2", "c:3"], 0, "0_0"),
        KeyQueryMetadata("b:2", ["c:3"], 2, "0_2"),
        KeyQueryMetadata("a:1", ["b:2"], 1, "0_1"),
    ]
    # the aggregate's keys: sub-topology 1, its repartition topic's murmur2
    assert [worker.store("by-region").metadata(r) for r in REGIONS] == [
        KeyQueryMetadata("a:1", ["b:2"], 2, "1_2"),
        KeyQueryMetadata("b:2", ["a:1"], 3, "1_3"),
        KeyQueryMetadata("a:1", ["b:2"], 2, "1_2"),
        KeyQueryMetadata("c:3", [], 1, "1_1"),
    ]


def test_a_global_store_is_on_every_server_and_answered_by_the_one_asked(worker):
    worker.application_server = "b:2"
    worker.fleet_map = FLEET
    assert worker.store("products").metadata("p1") == KeyQueryMetadata("b:2", ["a:1", "c:3"], None, "global")


def test_before_any_assignment_no_server_holds_anything(worker):
    """No assignment yet (an empty fleet map, no application server): the metadata names the
    partition and task only."""
    assert worker.fleet_map == {} and worker.application_server is None
    assert [worker.store("accounts").metadata(k) for k in ACCOUNTS[:2]] == [
        KeyQueryMetadata(None, [], 3, "0_3"), KeyQueryMetadata(None, [], 0, "0_0")]
    assert worker.store("products").metadata("p1") == KeyQueryMetadata(None, [], None, "global")


def test_task_holders_reads_one_assignment():
    assert task_holders(FLEET, (0, 0)) == ("a:1", ["b:2", "c:3"])
    assert task_holders(FLEET, (0, 3)) == (None, ["a:1"])
    assert task_holders(FLEET, (2, 0)) == (None, [])
    assert task_holders({}, (0, 0)) == (None, [])
    # task keys that came through JSON (lists) are the same tasks
    assert task_holders({"x:1": {"active": [[0, 0]], "standby": []}, "y:2": {"standby": [[0, 0]]}},
                        (0, 0)) == ("x:1", ["y:2"])


def test_an_unknown_store_is_named(worker):
    with pytest.raises(NoSuchStore, match=r"no queryable store named 'nope' \(queryable stores: "
                                          r"\['accounts', 'by-region', 'products'\]\)"):
        worker.store("nope").metadata("x")
