"""Secrets never shown (issue 47, item 3): a worker given every kind of secret setting, run at DEBUG
with its HTTP endpoint on, and then looked into with ``processor state``, shows none of their
values anywhere: not in a log line (its own, librdkafka's configuration dump, kafka-python's),
not in ``/metrics`` or the probes, not in any file of its state directory.

The settings are every one librdkafka itself redacts (``client_config.is_secret`` is checked
against that list in ``tests/unit/test_secret_settings.py``) that a PLAINTEXT client accepts, a
Java JAAS text, and the Schema Registry's credentials (user info in its URL included)."""

import socket
import subprocess
import sys
import urllib.request

from processor.kafka import clients as kafka
from tests.integration.helpers import produce, start_worker_process, wait_for, wait_until_group_drained
from tests.integration.test_operational_errors import ROOT, _env

SECRETS = {
    "sasl.username": "S3CRET-user", "sasl.password": "S3CRET-pass", "ssl.key.password": "S3CRET-keypass",
    "ssl.keystore.password": "S3CRET-keystore", "sasl.oauthbearer.config": "principal=S3CRET-oauth",
    "sasl.oauthbearer.client.secret": "S3CRET-client", "sasl.oauthbearer.assertion.private.key.passphrase":
        "S3CRET-passphrase",
}
REGISTRY = {"basic.auth.user.info": "reg:S3CRET-basic", "bearer.auth.token": "S3CRET-bearer"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_secret_value_appears_in_logs_metrics_or_the_state_directory(kafka_bootstrap, unique, tmp_path):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 2, out: 1})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    properties = tmp_path / "client.properties"   # as a Java client.properties file carries them
    properties.write_text("sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                          'username="S3CRET-jaasuser" password="S3CRET-jaas";\n')
    port = free_port()
    args = ["--config-file", str(properties), "--http-port", str(port),
            "--schema-registry-url", "http://reg:S3CRET-url@127.0.0.1:9",
            *[a for k, v in SECRETS.items() for a in ("--config", f"{k}={v}")],
            *[a for k, v in REGISTRY.items() for a in ("--schema-registry-config", f"{k}={v}")],
            "--consumer-config", "debug=conf", "--producer-config", "debug=conf"]
    log = tmp_path / "worker.log"
    (tmp_path / "s").mkdir()
    proc = start_worker_process(kafka_bootstrap, "tests.integration.apps:filter_topology", app, tmp_path / "s", log,
                                env, extra_args=args, log_level="DEBUG")
    try:
        produce(kafka_bootstrap, inp, [(f"k{i}".encode(), b'{"amount": %d}' % (90 + i)) for i in range(40)])
        def running():
            assert proc.poll() is None, log.read_text()[-3000:]
        wait_until_group_drained(kafka_bootstrap, app, {inp: 2}, timeout_s=90, check=running)
        shown = []
        for path in ("/metrics", "/healthz", "/readyz"):
            wait_for(lambda p=path: _get(port, p) is not None, 30, f"GET {path}")
            shown.append(_get(port, path))
    finally:
        proc.terminate()
        proc.wait(60)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Kafka client settings:" in text and "sasl.password=*****" in text   # the line is there, redacted
    assert "[redacted]" in text   # librdkafka's own configuration dump ran
    for command in (["state", "dump"], ["state", "stats"]):
        p = subprocess.run([sys.executable, "-m", "processor.cli", *command, "tests.integration.apps:filter_topology",
                            "--application-id", app, "--state-dir", str(tmp_path / "s")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env(env))
        assert p.returncode == 0, p.stderr[-3000:]
        shown.append(p.stdout + p.stderr)
    files = [f for f in (tmp_path / "s").rglob("*") if f.is_file()]
    assert len(files) > 5   # the databases, the lock, worker.id
    everything = [text.encode(), *(s.encode() for s in shown), *(f.read_bytes() for f in files)]
    values = [*SECRETS.values(), *REGISTRY.values(), "S3CRET-jaas", "S3CRET-url"]
    found = sorted({v for v in values for blob in everything if v.split(":")[-1].encode() in blob})
    assert found == [], found


def _get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None
