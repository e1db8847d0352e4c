"""Probe: static membership (group.instance.id) across a SIGKILL + restart, on a fresh Tansu.

N static members (worker stand-ins from builtin_assignors.py, with librdkafka debug=cgrp written
to <name>-<gen>.err) consume one 4-partition topic at 400 records/s; after 10 s member w2 is
SIGKILLed and restarted 1 s later with the same instance id; 15 s later everything stops.
Read the .jsonl files (assign/revoke/first) and the .err files (JoinGroup/SyncGroup/heartbeat).
Measured: with 2 members the restarted one got its partitions back 2.5 s and 15.2 s after the kill
(2 runs), no revocation elsewhere; with 3 members it waited in SyncGroup for ever (see
builtin_RESULTS.md).

Run: .venv/bin/python docs/decisions/group-protocol-prototypes/static_membership_probe.py cooperative-sticky 3 [client-id-suffix]
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import builtin_assignors as b  # noqa: E402

strategy, members = sys.argv[1], int(sys.argv[2])
suffix = sys.argv[3] if len(sys.argv) > 3 else ""
work = tempfile.mkdtemp(prefix="static-probe-")
proc, bs = b.start_tansu(work)
try:
    b.create_topics(bs, {"S": 4})
    load = b.Load(bs, {"S": 4}, 400)
    load.start()

    def start(name, gen):
        return subprocess.Popen(
            [sys.executable, b.HERE, "worker", "--bootstrap", bs, "--group", "sg", "--strategy", strategy,
             "--name", name, "--out", f"{work}/{name}-{gen}.jsonl", "--client-id", name + suffix,
             "--instance-id", "inst-" + name, "--topics", "S"],
            env={**os.environ, "PROBE_DEBUG": "cgrp"}, stderr=open(f"{work}/{name}-{gen}.err", "w"))

    ps = [start(f"w{i}", 0) for i in range(1, members + 1)]
    time.sleep(10)
    ps[1].send_signal(signal.SIGKILL)
    print("killed w2 at", time.time())
    time.sleep(1)
    ps[1] = start("w2", 1)
    time.sleep(15)
    for p in ps:
        p.send_signal(signal.SIGTERM)
    for p in ps:
        p.wait(15)
    load.stop = True
    load.join()
finally:
    proc.terminate()
    proc.wait()
print("logs in", work)
