"""A peer benchmark workload (``benchmarks/peers.py``) as a Quix Streams application, written as
its documentation shows: a ``StreamingDataFrame`` per input topic, RocksDB state with changelog
topics (Quix's defaults), at least once, a commit interval of 100 ms. Runs until SIGTERM.

    python quixstreams_app.py WORKLOAD BOOTSTRAP PREFIX OUT GROUP STATE_DIR

The same outputs as this project's ``peer_topologies.py``: a passing order or row as JSON (a
failing row: a tombstone), a count as an 8-byte big-endian long, a joined order as
``{"customer": ..., "order": ...}``. Quix Streams has no foreign-key join (``WORKLOADS``)."""

from __future__ import annotations

import sys

from quixstreams import Application

WORKLOADS = ["stream_filter", "table_filter", "count", "count_repartition", "stream_table_join"]


def long_bytes(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def count(_value, state) -> bytes:
    n = (state.get("count") or 0) + 1
    state.set("count", n)
    return long_bytes(n)


def main(workload: str, bootstrap: str, prefix: str, out: str, group: str, state_dir: str) -> None:
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      processing_guarantee="at-least-once", commit_interval=0.1, state_dir=state_dir,
                      consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
                      producer_extra_config={"linger.ms": 5}, loglevel="WARNING")

    def source(topic: str):
        return app.dataframe(app.topic(prefix + topic, key_deserializer="bytes", value_deserializer="json"))

    as_json = app.topic(out, key_serializer="bytes", value_serializer="json")
    as_bytes = app.topic(out, key_serializer="bytes", value_serializer="bytes")
    if workload == "stream_filter":
        source("orders").filter(lambda v: v["amount"] > 500).to_topic(as_json)
    elif workload == "table_filter":
        import json

        # a table's filter: the row while it passes, a tombstone once it does not
        rows = source("customer_updates").apply(
            lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")).encode() if v["amount"] > 500 else None)
        rows.to_topic(as_bytes)
    elif workload == "count":
        source("orders_by_customer").apply(count, stateful=True).to_topic(as_bytes)
    elif workload == "count_repartition":
        # group_by's key comes back as the str it returned (through the repartition topic's JSON)
        source("orders").group_by(lambda v: str(v["customer_id"]), name="customer_id").apply(
            count, stateful=True).to_topic(app.topic(out, key_serializer="str", value_serializer="bytes"))
    elif workload == "stream_table_join":
        customers = source("customers")
        source("orders_by_customer").join_asof(
            customers, how="inner", on_merge=lambda order, customer: {"customer": customer, "order": order}
        ).to_topic(as_json)
    else:
        raise SystemExit(f"Quix Streams: no workload {workload!r} (it offers {', '.join(WORKLOADS)})")
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
