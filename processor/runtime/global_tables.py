"""The worker's global tables: every partition of each global table's topic, held in one RocksDB
database beside the tasks' (``<state-dir>/<application-id>/global``), outside the group.

Invariant: ``bootstrap()`` returns only once every store holds its topic up to each partition's
end as partition EOF reports it (from the database's checkpoint: a restart reads only what came
since; an end after a transaction marker or deleted records is reached too); the worker calls it
before it joins the group, so no task processes a record against a table that is behind its
topic's start-up end. Afterwards ``poll()`` (each loop) applies what arrives, and ``commit()``
(with the worker's commits) persists the stores with the positions they reached, atomically.
Progress is logged while bootstrapping; ``records_skipped`` counts poison records
(``processor/engine/global_tables.py``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processor.engine.global_tables import apply_global_record
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.kafka.client_config import Cluster
from processor.state.rocksdb import RocksDBDatabase

log = logging.getLogger("processor.global")


class GlobalTables:
    def __init__(self, topology, bootstrap_servers: Cluster, consumer_config: dict, path):
        self.specs = {g.topic: g for g in topology.global_stores.values()}
        self.bootstrap_servers = bootstrap_servers
        self._consumer_config = consumer_config
        self.db = RocksDBDatabase(path, column_families=[g.name for g in self.specs.values()])
        self.stores = {g.name: self.db.store(g.name) for g in self.specs.values()}
        self.positions = self.db.read_checkpoint()
        self.records_applied = 0
        self.records_skipped = 0
        self.consumer: Consumer | None = None
        self._dirty = False

    def bootstrap(self, timeout_s: float = 600.0, commit_every: int = 50_000) -> None:
        """Read every partition from its checkpoint to its end (partition EOF: the end as the
        broker sees it then, wherever the last offset is a transaction marker or deleted),
        committing every ``commit_every`` records, so a crash keeps what was read."""
        counts = kafka.topic_partitions(self.bootstrap_servers)
        missing = sorted(t for t in self.specs if t not in counts)
        if missing:
            raise ConfigError(f"global table topic(s) {', '.join(missing)} do not exist on {self.bootstrap_servers}")
        conf = kafka.consumer_defaults(self.bootstrap_servers)
        conf.update(self._consumer_config)
        # a consumer of its own, outside the application's group (its group settings dropped)
        conf.update({"group.id": f"global-{time.time_ns()}", "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        conf.pop("group.instance.id", None)
        consumer = self.consumer = kafka.new_consumer(conf, "the global tables")
        parts = [(t, p) for t in sorted(self.specs) for p in range(counts[t])]
        kafka.assign(consumer, [TopicPartition(t, p, self.positions.get((t, p), OFFSET_BEGINNING))
                                for t, p in parts])
        todo = set(parts)
        log.info("global tables: bootstrapping %s (%d partition(s)) to their ends", ", ".join(sorted(self.specs)),
                 len(parts))
        deadline, last_log, since_commit = time.monotonic() + timeout_s, time.monotonic(), 0
        while todo:
            msgs: list[Any] = consumer.consume(1000, 0.2)   # (the stubs: topic() may be None; not here)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        tp = (m.topic(), m.partition())
                        self.positions[tp] = max(self.positions.get(tp, 0), m.offset())
                        todo.discard(tp)
                    elif err.fatal():
                        raise ConfigError(f"global tables: fatal Kafka error: {err.str()}")
                    else:
                        log.warning("global tables: Kafka error (librdkafka retries): %s", err.str())
                    continue
                self._apply(m)
                since_commit += 1
            if since_commit >= commit_every:
                self.commit()
                since_commit = 0
            if time.monotonic() > deadline:
                raise ConfigError(f"global tables: bootstrap did not reach the topics' ends within {timeout_s:g} s "
                                  f"({sorted(todo)} behind)")
            if time.monotonic() - last_log > 5:
                last_log = time.monotonic()
                log.info("global tables: %d record(s) applied, %d partition(s) to go", self.records_applied,
                         len(todo))
        self._dirty = True
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
        msgs: list[Any] = self.consumer.consume(max_records, 0)   # (as in bootstrap)
        for m in msgs:
            err = m.error()
            if err is None:
                self._apply(m)
                n += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                tp = (m.topic(), m.partition())
                if m.offset() > self.positions.get(tp, 0):   # past markers or deleted records
                    self.positions[tp] = m.offset()
                    self._dirty = True
            elif err.fatal():
                raise ConfigError(f"global tables: fatal Kafka error: {err.str()}")
            else:
                log.warning("global tables: Kafka error (librdkafka retries): %s", err.str())
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
