"""An aggregate's value and last-emitted columns are column families of the task's database."""

from processor import StreamsBuilder
from processor.engine.task import Task
from processor.state.rocksdb import RocksDBDatabase


class Sink:
    def send(self, *a):
        pass


def test_aggregate_stores_are_column_families_committed_with_the_offsets(tmp_path):
    b = StreamsBuilder()
    b.stream("clicks").group_by_key().count(name="clicks-per-user").to_stream().to("out")
    topo = b.build().for_application("app")
    db = RocksDBDatabase(tmp_path / "task")
    t = Task(topo, 0, 0, db, Sink(), lambda: 0, on_error="fail")
    t.process("clicks", 0, 0, 5, b"u1", b"{}")
    t.commit()
    t.process("clicks", 0, 1, 6, b"u1", b"{}")   # not committed
    t.close()
    db = RocksDBDatabase(tmp_path / "task")
    try:
        assert ({"clicks-per-user", "clicks-per-user.emitted", "_bookkeeping", "__task", "__checkpoint"}
                <= set(db.column_families()))
        assert db.read_checkpoint() == {("clicks", 0): 1}
        assert db.store("clicks-per-user").get(b"u1") == (5).to_bytes(8, "big") + b"1"
        assert db.store("clicks-per-user.emitted").get(b"u1") == b"\x01\x01" + (5).to_bytes(8, "big") + bytes(8) + b"1"
        assert db.store("_bookkeeping").get(b"observed_time\x00KTABLE-AGGREGATE-0000000001") == (5).to_bytes(8, "big")
        assert db.store("__task").get(b"observed_time\x00KTABLE-AGGREGATE-0000000001") is None
    finally:
        db.close()
