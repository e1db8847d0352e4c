"""Kafka Streams and this project share topics on Apache Kafka: each reads what the other wrote.

For each twin below, a Kafka Streams 4.4 application (``StreamsApp``) and ``processor run`` run
it on the same input topics, each writing its own outputs; at the same time a reader of each
side (``InteropReader.java``, ``tests.reference.on_broker:reader``) reads the OTHER side's
outputs with that output's serdes and writes their records as text (``key@start-end`` for a
windowed key). Four applications on shared topics, all started before the input is produced.

Once every group has committed every topic it reads to its end: what this project read from
Kafka Streams' bytes must equal what Kafka Streams read from this project's bytes, per key (a
table: its final value; a stream: its records with their timestamps). The outputs cover
time-windowed and session-windowed keys, the integer, long and double serdes, and a foreign-key
join's output.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    kill_leftover_workers,
    start_worker_process,
    stop_workers,
    wait_until_group_drained,
)
from tests.integration.streams_apps import (
    close_kafka_streams,
    per_key,
    produce_steps,
    read_all,
    start_kafka_streams,
    wait_until_app_drained,
)
from tests.reference.inputs import encoded, generate
from tests.reference.twins import TWINS

PARTITIONS = 4
RECORDS = 1000

# (twin, its params, {output: (key serde, value serde, what it is)})
CHAINS = [
    ("windowed_keys_raw", {}, {"out": ("windowed10", "long", "table")}),
    ("session_keys_raw", {}, {"out": ("session", "long", "table")}),
    ("number_serdes", {}, {"out-scaled": ("integer", "double", "stream"), "out-sum": ("integer", "long", "table")}),
    ("fk_join", {"how": "left"}, {"out": ("string", "string", "table")}),
]
# What is compared is how each reads the other's bytes, so the twins' results must not depend on
# timing: Kafka Streams' record cache off (with it, D10 and D11 of docs/reference.md do)
KAFKA_STREAMS_SETTINGS = {"statestore.cache.max.bytes": "0"}


@pytest.mark.parametrize(("name", "params", "outputs"), CHAINS, ids=[c[0] for c in CHAINS])
def test_each_reads_what_the_other_wrote(kafka_bootstrap, tmp_path, unique, name, params, outputs):
    twin = TWINS[name]
    prefix = f"interop-{unique}-"
    written = {"ks": f"{prefix}ks-", "py": f"{prefix}py-"}          # each side's twin writes here
    read = {"ks": f"{prefix}ks-read-", "py": f"{prefix}py-read-"}    # each side's reader writes here
    other = {"ks": "py", "py": "ks"}
    inputs = {prefix + t: PARTITIONS for t in twin.inputs}
    kafka.create_topics(kafka_bootstrap, {**inputs, **{p + o: PARTITIONS for o in outputs
                                                       for p in [*written.values(), *read.values()]}})
    steps = encoded([s for s in generate(twin.inputs, seed=11, n=RECORDS, null_keys=False) if s[0] != "advance"],
                    twin.input_serdes)
    apps = {f"{who}-{role}": f"interop-{who}-{role}-{unique}" for who in ("ks", "py") for role in ("twin", "reader")}
    reader_params = {who: {"topics": {written[other[who]] + o: {"key": k, "value": v, "out": read[who] + o}
                                      for o, (k, v, _kind) in outputs.items()}} for who in ("ks", "py")}
    procs: dict[str, subprocess.Popen] = {}
    logs = {app: tmp_path / f"{app}.log" for app in apps}
    try:
        for role, twin_name, p in (("twin", name, lambda who: {**params, "prefix": prefix, "out_prefix": written[who]}),
                                   ("reader", "interop:reader", lambda who: reader_params[who])):
            procs[f"ks-{role}"] = start_kafka_streams(twin_name, p("ks"), kafka_bootstrap, apps[f"ks-{role}"],
                                                      tmp_path / f"ks-{role}-state", logs[f"ks-{role}"],
                                                      KAFKA_STREAMS_SETTINGS)
            spec = "tests.reference.on_broker:" + ("topology" if role == "twin" else "reader")
            procs[f"py-{role}"] = start_worker_process(
                kafka_bootstrap, spec, apps[f"py-{role}"], tmp_path / f"py-{role}-state", logs[f"py-{role}"],
                {"REFERENCE_TWIN": name, "REFERENCE_PARAMS": json.dumps(p("py"))})
        produce_steps(kafka_bootstrap, prefix, steps, int(time.time() * 1000) - 600_000)

        def alive():
            for app, proc in procs.items():
                assert proc.poll() is None, f"{app} exited {proc.returncode}: " + logs[app].read_text()[-3000:]
        for who in ("ks", "py"):
            wait_until_app_drained(kafka_bootstrap, apps[f"{who}-twin"], inputs, check=alive)
        for who in ("ks", "py"):
            wait_until_group_drained(kafka_bootstrap, apps[f"{who}-reader"],
                                     {written[other[who]] + o: PARTITIONS for o in outputs}, timeout_s=180, check=alive)
        stop_workers([procs["py-twin"], procs["py-reader"]], [logs["py-twin"], logs["py-reader"]])
    finally:
        for app, proc in procs.items():
            if app.startswith("ks-"):
                close_kafka_streams(proc)
        kill_leftover_workers([p for a, p in procs.items() if a.startswith("py-")])
    for o, (_k, _v, kind) in outputs.items():
        ours = per_key(read_all(kafka_bootstrap, read["py"] + o), kind)      # Kafka Streams' bytes, read here
        theirs = per_key(read_all(kafka_bootstrap, read["ks"] + o), kind)    # this project's, read there
        assert ours, f"{name} {o}: nothing read here from Kafka Streams' output"
        differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        assert not differing, (f"{name} {o}: {len(differing)} of {len(ours)} keys read differently; first: "
                               f"{differing[0]!r}: here {ours.get(differing[0])!r}, "
                               f"in Kafka Streams {theirs.get(differing[0])!r}")
