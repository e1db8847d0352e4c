"""``processor state dump|stats`` on a stopped worker's state directory: the dump equals the test
driver's stores for the same history; a directory a running worker holds is refused (exit 4);
the databases are opened read-only (a dump changes no file in them)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from processor.kafka import clients as kafka
from processor.runtime.state_lock import StateDirLock
from processor.runtime.worker import Worker
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import pipe_messages, produce_interleaved, reliability_scenario

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tests.integration.apps:reliability_topology"
PARTS = 2


def cli(args, env):
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=e)


def files_of(root: Path) -> dict[str, object]:
    """Every file's size and modification time; rocksdict's own ``rocksdict-config.json``, which
    it writes again on every open (read-only too), by its contents."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.name == "rocksdict-config.json"
                                       else (p.stat().st_size, p.stat().st_mtime_ns))
            for p in root.rglob("*") if p.is_file() and p.name != "LOCK" and p.name != ".lock"}


def test_dump_equals_the_drivers_stores_and_a_held_directory_is_refused(kafka_bootstrap, unique, tmp_path,
                                                                        monkeypatch, report):
    orders, customers, prefix, app = f"so-{unique}", f"sc-{unique}", f"sp-{unique}", f"sapp-{unique}"
    env = {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_OUTPUT_PREFIX": prefix}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {orders: PARTS, customers: PARTS, f"{prefix}-enriched": PARTS,
                                          f"{prefix}-totals": PARTS})
    records = reliability_scenario(orders, customers, 1500, orders=200, customers=40)
    produce_interleaved(kafka_bootstrap, records)
    w = Worker(apps.reliability_topology(), kafka_bootstrap, app, tmp_path, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)

    before = files_of(tmp_path / app)
    p = cli(["state", "dump", SPEC, "--application-id", app, "--state-dir", str(tmp_path)], env)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert files_of(tmp_path / app) == before        # read-only: no database file touched
    dumped: dict[str, dict] = {}
    for x in lines:
        if "key" in x:
            dumped.setdefault(x["store"], {})[json.dumps(x["key"])] = x["value"]

    driver = TopologyTestDriver(apps.reliability_topology())
    with driver:
        pipe_messages(driver, kafka.read_topic(kafka_bootstrap, orders) + kafka.read_topic(kafka_bootstrap, customers))
        want = {name: {json.dumps(k): v for k, v in driver.get_store(name).items()}
                for name in ("orders-store", "customers-store", "enriched", "totals")}
    for name, rows in want.items():
        assert dumped[name] == rows, name
    assert all(isinstance(x["task"], str) and "_" in x["task"] for x in lines)

    # stats: entries per store add up to the dump's lines (plus what only --raw prints)
    s = cli(["state", "stats", SPEC, "--application-id", app, "--state-dir", str(tmp_path)], env)
    assert s.returncode == 0, s.stderr[-2000:]
    counted: dict[str, int] = {}
    for line in s.stdout.splitlines():
        parts = line.split()
        counted[parts[2]] = counted.get(parts[2], 0) + int(parts[3].replace(",", ""))
    for name in want:
        assert counted[name] == sum(1 for x in lines if x["store"] == name), name
    raw = cli(["state", "dump", SPEC, "--application-id", app, "--state-dir", str(tmp_path), "--raw",
               "--store", "_bookkeeping"], env)
    assert raw.returncode == 0 and raw.stdout, raw.stderr[-2000:]
    assert all(set(json.loads(x)) == {"task", "store", "key_hex", "value_hex"} for x in raw.stdout.splitlines())
    assert len(raw.stdout.splitlines()) == counted["_bookkeeping"]

    # a directory a running worker holds: exit 4, one line, nothing read
    with StateDirLock(tmp_path / app):
        held = cli(["state", "dump", SPEC, "--application-id", app, "--state-dir", str(tmp_path)], env)
    assert held.returncode == 4 and held.stdout == "", (held.stdout[-500:], held.stderr[-2000:])
    assert held.stderr.strip().splitlines()[-1].startswith("processor: error: state directory ")
    report(f"state dump: {len(lines)} entries over {len(dumped)} stores equal the driver's "
           f"({', '.join(f'{n}: {len(v)}' for n, v in want.items())}); no database file changed; "
           f"a held directory refused with exit 4")
