"""One client configuration for every connection (issue 14, item 3), on the real broker.

The user's settings (a Java ``client.properties`` file, ``--config``, per-kind flags,
``PROCESSOR_*`` environment variables) must reach every Kafka client the worker and the backfill
open: a secured cluster refuses any client that lacks them. Each client logs its role and
settings (secrets redacted) at DEBUG when it opens (``processor.clients``); these tests run the
worker (fresh, then restoring after a wiped state directory, under exactly_once) and the
backfill command (driver and Spark executors) with a ``client.id`` and a socket setting from a
properties file, and assert that every client of every role carries both, that the roles that
must exist did open, and that the results are right. Whether the local broker can offer a
listener that really requires TLS or SASL is probed and reported by name
(``tests/support/secured_listener.py``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys

from processor.kafka import clients as kafka
from processor.kafka.client_config import build_client_config
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.integration import apps
from tests.integration.helpers import (
    final_table,
    final_table_values,
    pipe_messages,
    produce_interleaved,
    reliability_scenario,
)
from tests.support.secured_listener import probe_secured_listeners

PARTS = 2
SPEC = "tests.integration.apps:reliability_topology"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPENING = re.compile(r"opening (consumer|producer|admin client) for (.+?): (.*)$")


def _properties(path, client_id: str, bootstrap: str | None = None):
    lines = ["# as a client.properties file is written",
             f"client.id={client_id}",
             "socket.keepalive.enable = true",
             "client.dns.lookup=use_all_dns_ips"]          # Java-only: ignored, named in the log
    if bootstrap:
        lines.insert(1, f"bootstrap.servers={bootstrap}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _check_every_client(openings, client_id) -> dict[str, int]:
    """{role: clients opened}; every client carries the file's settings, none the ignored key."""
    roles: dict[str, int] = {}
    for kind, role, settings in openings:
        assert f"client.id={client_id}" in settings, (kind, role, settings)
        assert "socket.keepalive.enable=true" in settings, (kind, role, settings)
        assert "client.dns.lookup" not in settings, (kind, role, settings)
        roles[f"{kind} for {role}"] = roles.get(f"{kind} for {role}", 0) + 1
    return roles


def test_every_worker_client_gets_the_settings(kafka_bootstrap, unique, tmp_path, monkeypatch, caplog, report):
    orders, customers, prefix, app = f"cs-orders-{unique}", f"cs-customers-{unique}", f"cs-{unique}", f"cs-{unique}"
    for k, v in {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": prefix}.items():
        monkeypatch.setenv(k, v)
    outs = {j: f"{prefix}-{j}" for j in ("enriched", "totals")}
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, **{t: PARTS for t in outs.values()}})
    produce_interleaved(kafka_bootstrap, reliability_scenario(orders, customers, 3000, seed=4))
    client_id = f"settings-probe-{unique}"
    config = build_client_config([_properties(tmp_path / "client.properties", client_id)], [],
                                 consumer_pairs=["session.timeout.ms=6000", "heartbeat.interval.ms=500"])
    assert config.ignored == ("client.dns.lookup",)
    caplog.set_level(logging.DEBUG, logger="processor.clients")

    def run(guarantee, consumer_config=None):
        w = Worker(apps.reliability_topology(), kafka_bootstrap, app, tmp_path / "state", commit_interval_ms=200,
                   client_config=config, processing_guarantee=guarantee, consumer_config=consumer_config)
        w.run(until_drained=True, install_signal_handlers=False)
        return w

    first = run("at_least_once")
    shutil.rmtree(tmp_path / "state")                 # the second run restores from the changelogs
    # exactly_once: the transactional producer (read_uncommitted: docs/semantics.md "Isolation level" for Tansu)
    second = run("exactly_once", {"isolation.level": "read_uncommitted"})
    assert first.records_processed > 3000 and second.records_processed == 0 and second.restored_records > 0

    openings = [m.groups() for r in caplog.records if r.name == "processor.clients"
                and (m := OPENING.match(r.getMessage()))]
    roles = _check_every_client(openings, client_id)
    must = {"consumer for the consumer group", "producer for outputs", "producer for changelogs",
            "producer for outputs, changelogs and offsets (transactional)", "consumer for restoring task stores",
            "admin client for topic administration", "consumer for sampling source keys (partitioner detection)"}
    assert must <= set(roles), sorted(roles)

    # and the results are right: the outputs, read as tables, are the driver's
    driver = TopologyTestDriver(apps.reliability_topology())
    with driver:
        pipe_messages(driver, kafka.read_topic(kafka_bootstrap, orders) + kafka.read_topic(kafka_bootstrap, customers))
        want = {j: final_table_values(driver.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()))
                for j, t in outs.items()}
    for j, t in outs.items():
        assert final_table(kafka.read_topic(kafka_bootstrap, t)) == want[j], j
    report(f"{len(openings)} clients opened in 2 worker runs, every one with the properties file's settings: "
           + ", ".join(f"{r} x{n}" for r, n in sorted(roles.items())))


def test_every_backfill_client_gets_the_settings_driver_and_executors(kafka_bootstrap, unique, tmp_path, report):
    orders, customers, prefix, app = f"csb-orders-{unique}", f"csb-customers-{unique}", f"csb-{unique}", f"csb-{unique}"
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, f"{prefix}-enriched": PARTS,
                                          f"{prefix}-totals": PARTS})
    produce_interleaved(kafka_bootstrap, reliability_scenario(orders, customers, 2000, seed=6))
    client_id = f"settings-probe-{unique}"
    props = _properties(tmp_path / "client.properties", client_id, bootstrap=kafka_bootstrap)
    state = tmp_path / "state"
    # everything but the properties file from the environment, as a container would set it
    env = dict(os.environ, APP_ORDERS=orders, APP_CUSTOMERS=customers, APP_OUTPUT_PREFIX=prefix,
               PROCESSOR_APPLICATION_ID=app, PROCESSOR_STATE_DIR=str(state), PROCESSOR_MASTER="local[2]",
               PROCESSOR_CONSUMER_CONFIG="session.timeout.ms=6000\nheartbeat.interval.ms=500",
               PROCESSOR_LOG_LEVEL="DEBUG", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "processor.cli", "backfill", SPEC, "--config-file", str(props)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = (p.stdout + p.stderr).splitlines()
    openings = [(m.groups(), "[executor " in ln) for ln in lines if (m := OPENING.search(ln))]
    roles = _check_every_client([o for o, _ in openings], client_id)
    driver_roles = {r for (k, r, _), ex in openings if not ex}
    executor_roles = {r for (k, r, _), ex in openings if ex}
    assert {"the snapshot of source partitions", "checking the group's committed offsets",
            "committing the group's offsets at the snapshot", "topic administration",
            "sampling source keys (partitioner detection)"} <= driver_roles, sorted(driver_roles)
    reads = {r for r in executor_roles
             if re.fullmatch(rf"reading ({orders}|{customers})\[\d\] offsets \[\d+, \d+\)", r)}
    changelogs = {r for r in executor_roles if re.fullmatch(r"changelogs of task \d+_\d+", r)}
    assert len(reads) == 2 * PARTS and changelogs, sorted(executor_roles)
    assert any("Kafka client settings: consumer: " in ln and "client.id=" + client_id in ln for ln in lines)
    assert any(ln.startswith("rows read 2000") or "rows read 2000" in ln for ln in lines), p.stdout[-2000:]
    assert sorted(d.name for d in (state / app).glob("task-*")), "no task databases installed"
    report(f"backfill: {len(openings)} clients opened ({sum(ex for _, ex in openings)} in executors), every "
           f"one with the properties file's settings; roles: "
           + ", ".join(sorted({r.split(' offsets')[0] for r in roles})))


def test_secured_listener_of_the_local_broker_is_probed(report):
    probe = probe_secured_listeners()
    for line in probe.describe():
        report(f"secured listener {line}")
    # the probe answered both questions with what it saw (a "no" is an answer)
    assert "plaintext client:" in probe.details["tls"] and "client without SASL:" in probe.details["sasl"]
