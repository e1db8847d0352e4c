"""The worker's global tables: every partition of each global table's topic, held in one RocksDB
database beside the tasks' (``<state-dir>/<application-id>/global``), outside the group.

Invariant: ``bootstrap()`` returns only once every store holds its topic up to the ends the
topics had when it started (from the database's checkpoint: a restart reads only what came
since); the worker calls it before it joins the group, so no task processes a record against a
table that is behind its topic's start-up end. Afterwards ``poll()`` (each loop) applies what
arrives, and ``commit()`` (with the worker's commits) persists the stores with the positions
they reached, atomically. Progress is logged while bootstrapping; ``records_skipped`` counts
poison records (``processor/engine/global_tables.py``).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import TopicPartition

from processor.engine.global_tables import apply_global_record
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.state.rocksdb import RocksDBDatabase

log = logging.getLogger("processor.global")


class GlobalTables:
    def __init__(self, topology, bootstrap_servers: str, consumer_config: dict, path):
        self.specs = {g.topic: g for g in topology.global_stores.values()}
        self.bootstrap_servers = bootstrap_servers
        self._consumer_config = consumer_config
        self.db = RocksDBDatabase(path, column_families=[g.name for g in self.specs.values()])
        self.stores = {g.name: self.db.store(g.name) for g in self.specs.values()}
        self.positions = self.db.read_checkpoint()
        self.records_applied = 0
        self.records_skipped = 0
        self.consumer = None
        self._dirty = False

    def bootstrap(self, timeout_s: float = 600.0) -> None:
        counts = kafka.topic_partitions(self.bootstrap_servers)
        missing = sorted(t for t in self.specs if t not in counts)
        if missing:
            raise ConfigError(f"global table topic(s) {', '.join(missing)} do not exist on {self.bootstrap_servers}")
        conf = kafka.consumer_defaults(self.bootstrap_servers)
        conf.update(self._consumer_config)
        conf.update({"group.id": f"global-{time.time_ns()}", "enable.auto.commit": False,
                     "enable.partition.eof": True})
        conf.pop("group.instance.id", None)
        self.consumer = kafka.new_consumer(conf, "the global tables")
        parts = [(t, p) for t in sorted(self.specs) for p in range(counts[t])]
        ends = {}
        for t, p in parts:
            _, hi = self.consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            ends[(t, p)] = hi
        kafka.assign(self.consumer, [TopicPartition(t, p, self.positions.get((t, p), 0)) for t, p in parts])
        todo = {tp for tp, e in ends.items() if self.positions.get(tp, 0) < e}
        total = sum(max(0, e - self.positions.get(tp, 0)) for tp, e in ends.items())
        log.info("global tables: bootstrapping %d record(s) of %s", total, ", ".join(sorted(self.specs)))
        deadline, last_log = time.monotonic() + timeout_s, time.monotonic()
        while todo:
            for m in self.consumer.consume(1000, 0.2):
                tp = (m.topic(), m.partition())
                if m.error() is not None:
                    if m.error().code() == m.error()._PARTITION_EOF and self.positions.get(tp, 0) >= ends[tp]:
                        todo.discard(tp)
                    continue
                self._apply(m)
                if self.positions[tp] >= ends[tp]:
                    todo.discard(tp)
            if time.monotonic() > deadline:
                raise ConfigError(f"global tables: bootstrap did not reach the topics' ends within {timeout_s:g} s "
                                  f"({sorted(todo)} behind)")
            if time.monotonic() - last_log > 5:
                last_log = time.monotonic()
                log.info("global tables: %d of %d record(s) applied", self.records_applied, total)
        self.commit()
        log.info("global tables: bootstrapped (%d record(s) applied, %d skipped)", self.records_applied,
                 self.records_skipped)

    def _apply(self, m) -> None:
        spec = self.specs[m.topic()]
        if apply_global_record(self.stores[spec.name], spec, m.key(), m.value(), m.timestamp()[1]):
            self.records_applied += 1
        else:
            self.records_skipped += 1
            log.warning("global table %s: record %s[%d]@%d skipped (no key, or it does not deserialize)",
                        spec.name, m.topic(), m.partition(), m.offset())
        self.positions[(m.topic(), m.partition())] = m.offset() + 1
        self._dirty = True

    def poll(self, max_records: int = 500) -> int:
        """Apply what arrived since (without waiting); returns the records seen."""
        if self.consumer is None:
            return 0
        n = 0
        for m in self.consumer.consume(max_records, 0):
            if m.error() is None:
                self._apply(m)
                n += 1
        return n

    def commit(self) -> None:
        if self._dirty:
            self.db.commit(dict(self.positions))
            self._dirty = False

    def metrics(self) -> dict:
        return {"records_applied": self.records_applied, "records_skipped": self.records_skipped}

    def close(self) -> None:
        try:
            if self.consumer is not None:
                self.consumer.close()
        finally:
            self.consumer = None
            self.db.close()
