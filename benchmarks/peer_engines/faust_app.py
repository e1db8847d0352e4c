"""A peer benchmark workload (``benchmarks/peers.py``) as a Faust application (faust-streaming),
written as its documentation shows: an agent per input topic, a ``Table`` on ``rocksdb://``
with its changelog topic (Faust's default), at least once, a commit interval of 100 ms. Runs
until SIGTERM.

    python faust_app.py WORKLOAD BOOTSTRAP PREFIX OUT GROUP STATE_DIR

The same outputs as this project's ``peer_topologies.py``. Faust has no join (its join
strategies' ``process`` raises ``NotImplementedError``): ``WORKLOADS`` has none."""

from __future__ import annotations

import json
import sys

import faust

WORKLOADS = ["stream_filter", "table_filter", "count", "count_repartition"]


def main(workload: str, bootstrap: str, prefix: str, out: str, group: str, state_dir: str) -> None:
    if workload not in WORKLOADS:
        raise SystemExit(f"Faust: no workload {workload!r} (it offers {', '.join(WORKLOADS)})")
    app = faust.App(group, broker=f"kafka://{bootstrap}", store="rocksdb://", datadir=state_dir,
                    processing_guarantee="at_least_once", broker_commit_interval=0.1,
                    broker_session_timeout=6.0, broker_heartbeat_interval=0.5,
                    consumer_auto_offset_reset="earliest", producer_linger_ms=5, topic_partitions=4,
                    topic_replication_factor=1, topic_disable_leader=True, web_enabled=False)
    raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    source = app.topic(prefix + {"stream_filter": "orders", "table_filter": "customer_updates",
                                 "count": "orders_by_customer", "count_repartition": "orders"}[workload],
                       partitions=4, **raw)
    sink = app.topic(out, partitions=4, **raw)
    counting = workload in ("count", "count_repartition")
    counts = app.Table(f"{group}-counts", default=int, partitions=4, key_type=str, value_type=int) if counting else None

    @app.agent(source)
    async def process(stream):
        if workload == "count_repartition":
            # named per run: Faust names a repartition topic after the agent, not the application
            stream = stream.group_by(lambda v: str(json.loads(v)["customer_id"]), name=f"{group}-customer_id")
        async for key, value in stream.items():
            v = json.loads(value)
            if workload == "stream_filter":
                if v["amount"] > 500:
                    await sink.send(key=key, value=value)
            elif workload == "table_filter":   # the row while it passes, a tombstone once it does not
                await sink.send(key=key, value=value if v["amount"] > 500 else None)
            else:
                assert counts is not None
                k = key.decode() if isinstance(key, bytes) else str(key)
                counts[k] += 1
                await sink.send(key=k.encode(), value=counts[k].to_bytes(8, "big", signed=True))

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main(*sys.argv[1:])
