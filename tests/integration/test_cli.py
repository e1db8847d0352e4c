"""`processor` command errors: one clear line on stderr, non-zero exit, no traceback; and
`processor describe`."""

import os
import subprocess
import sys

from processor.kafka import clients as kafka

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args, env=None, timeout=60):
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=e)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("processor: error: ")
    for f in fragments:
        assert f in lines[0], lines[0]


def test_unreachable_broker(tmp_path):
    p = run_cli("run", "tests.integration.apps:filter_topology", "--bootstrap-servers", "127.0.0.1:1",
                "--application-id", "x", "--state-dir", str(tmp_path), env={"APP_INPUT": "a", "APP_OUTPUT": "b"})
    assert_one_line_error(p, "cannot reach Kafka at 127.0.0.1:1")


def test_missing_topic(kafka_bootstrap, unique, tmp_path):
    kafka.create_topics(kafka_bootstrap, {f"out-{unique}": 1})
    p = run_cli("run", "tests.integration.apps:filter_topology", "--bootstrap-servers", kafka_bootstrap,
                "--application-id", "x", "--state-dir", str(tmp_path),
                env={"APP_INPUT": f"missing-{unique}", "APP_OUTPUT": f"out-{unique}"})
    assert_one_line_error(p, f"missing-{unique}", "do not exist")


def test_co_partitioning_mismatch_is_refused(kafka_bootstrap, unique, tmp_path):
    app = tmp_path / "copart.py"
    app.write_text(
        "from processor import StreamsBuilder\n"
        "def topo():\n"
        "    b = StreamsBuilder()\n"
        f"    b.stream('l-{unique}').merge(b.stream('r-{unique}')).to('o-{unique}')\n"
        "    return b.build()\n")
    kafka.create_topics(kafka_bootstrap, {f"l-{unique}": 2, f"r-{unique}": 3, f"o-{unique}": 1})
    p = run_cli("run", f"{app}:topo", "--bootstrap-servers", kafka_bootstrap, "--application-id", "x",
                "--state-dir", str(tmp_path))
    assert_one_line_error(p, "co-partitioned source topics of sub-topology 0",
                          f"l-{unique}=2, r-{unique}=3")


def test_unresolvable_module_or_attribute(tmp_path):
    for spec, fragment in [("no_such_module:topo", "cannot import module 'no_such_module'"),
                           ("tests.integration.apps:nope", "has no attribute 'nope'"),
                           ("just-a-module", "expected MODULE:ATTR")]:
        p = run_cli("run", spec, "--bootstrap-servers", "127.0.0.1:1", "--application-id", "x",
                    "--state-dir", str(tmp_path))
        assert_one_line_error(p, fragment)


def test_describe(tmp_path):
    p = run_cli("describe", "tests.integration.apps:filter_topology", env={"APP_INPUT": "i", "APP_OUTPUT": "o"})
    assert p.returncode == 0, p.stderr
    assert "Source: KTABLE-SOURCE-0000000000 (topics: [i])" in p.stdout
    assert "Sink: KSTREAM-SINK-0000000003 (topic: o)" in p.stdout
