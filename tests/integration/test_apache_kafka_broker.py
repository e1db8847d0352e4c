"""Apache Kafka assembled from Maven Central by the project's own pom (processor.runtime.apache_kafka):
``processor broker --apache-kafka`` for a user, a three-node KRaft cluster for the broker-failure
tests, and one clear line for each way it cannot start (a port taken, no Java, Maven unable to
reach Maven Central, a version older than KRaft-only Kafka).

These tests need Java and Maven, as CI's machine has them: on a machine without them they fail
(the message says what is missing), they do not skip."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from processor.runtime.apache_kafka import DEFAULT_VERSION, ApacheKafka
from tests.integration.test_cli import ROOT, assert_one_line_error, run_cli


def _broker_cli(*args, env=None):
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "processor.cli", "broker", "--apache-kafka", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=e)


def _roundtrip(bootstrap: str, topic: str, n: int = 100) -> list[bytes]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if len(got) >= n:
                break
            continue
        got.append(m.value())
    c.close()
    return got


def test_processor_broker_apache_kafka_serves_clients_and_stops_on_sigterm(tmp_path, unique):
    proc = _broker_cli("--data-dir", str(tmp_path / "kafka"))
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        admin = AdminClient({"bootstrap.servers": line})
        topic = f"cli-{unique}"
        for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(30)
        assert _roundtrip(line, topic) == [b"v%d" % i for i in range(100)]
        assert (tmp_path / "kafka" / "node-1" / "server.log").read_text().count(f"Kafka version: {DEFAULT_VERSION}")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, proc.stderr.read()


def test_port_taken_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("broker", "--apache-kafka", "--port", str(port), timeout=120)
    assert p.returncode == 2
    assert_one_line_error(p, f"port {port} on 127.0.0.1 is taken")


def test_no_java_is_one_line(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mvn",):   # Maven but no Java on PATH
        os.symlink(shutil.which(tool), bin_dir / tool)
    p = run_cli("broker", "--apache-kafka", env={"PATH": str(bin_dir)}, timeout=60)
    assert p.returncode == 2
    assert_one_line_error(p, "Apache Kafka needs Java 17 or later on PATH")


def test_maven_central_unreachable_is_one_line(tmp_path):
    # Maven with an empty local repository whose every download goes to a closed loopback port
    home = tmp_path / "home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>closed</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>")
    env = {"PROCESSOR_CACHE_DIR": str(tmp_path / "cache"),
           "MAVEN_OPTS": f"-Duser.home={home} -Dmaven.repo.local={home / 'repo'}"}
    p = run_cli("broker", "--apache-kafka", env=env, timeout=300)
    assert p.returncode == 2
    assert_one_line_error(p, f"Maven could not fetch Apache Kafka {DEFAULT_VERSION} from Maven Central",
                          "check that Maven Central is reachable")
    assert not (tmp_path / "cache" / f"apache-kafka-{DEFAULT_VERSION}" / "libs").exists()


def test_a_version_without_kraft_only_mode_is_one_line():
    for version, fragment in [("3.9.1", "KRaft-only brokers start at 4.0"), ("0.10.2", "no transactions"),
                              ("latest", "is not a release number")]:
        p = run_cli("broker", "--apache-kafka", "--kafka-version", version, timeout=60)
        assert p.returncode == 2
        assert_one_line_error(p, fragment)


def _partition_with_full_isr(admin, topic, timeout_s=60.0):
    """Partition 0's metadata once every replica is in sync (a created topic's metadata reaches
    the node that answers a little after CreateTopics returns: an empty partition list at first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        t = admin.list_topics(topic, timeout=30).topics.get(topic)
        meta = t.partitions.get(0) if t is not None else None
        if meta is not None and meta.leader >= 0 and len(meta.isrs) == len(meta.replicas):
            return meta
        assert time.monotonic() < deadline, f"{topic}[0] not fully in sync after {timeout_s:.0f} s: {meta}"
        time.sleep(0.2)


def _topic_configs(admin, topic, timeout_s=60.0):
    """The topic's configs, once the node that answers knows the topic (each node learns a created
    topic from the metadata log on its own: a loaded one answered UNKNOWN_TOPIC_OR_PART after
    another node's metadata already showed every replica in sync)."""
    deadline = time.monotonic() + timeout_s
    while True:
        (res,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
        try:
            return res.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_three_node_cluster_survives_a_leader_killed_and_a_rolling_restart(tmp_path, unique):
    """The cluster the broker-failure tests use: replication factor 3, min.insync.replicas=2;
    acks=all produce goes on with the leader SIGKILLed and through a rolling restart."""
    with ApacheKafka(nodes=3, directory=tmp_path / "cluster") as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        topic = f"rf3-{unique}"
        for f in admin.create_topics([NewTopic(topic, 1)]).values():   # the broker's defaults: rf 3
            f.result(30)
        meta = _partition_with_full_isr(admin, topic)
        assert sorted(meta.replicas) == [1, 2, 3]
        assert _topic_configs(admin, topic)["min.insync.replicas"].value == "2"
        leader = meta.leader
        cluster.kill(leader)
        got = _roundtrip(cluster.bootstrap_servers, topic, 50)
        assert got == [b"v%d" % i for i in range(50)]
        cluster.start_node(leader)
        for node in cluster.nodes:
            cluster.stop_node(node.node_id)
            cluster.start_node(node.node_id)
        got = _roundtrip(cluster.bootstrap_servers, topic, 100)
        assert got[:50] == [b"v%d" % i for i in range(50)]
        assert got[50:] == [b"v%d" % i for i in range(100)]


def test_under_ci_a_fall_back_from_apache_kafka_is_a_usage_error(tmp_path):
    """CI's integration suite runs on Apache Kafka: with CI=true and no Java or Maven on PATH,
    pytest stops at once and says what to do, instead of running on Tansu."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # (not this run's xdist worker either: the check runs in the controlling process)
    env = {k: v for k, v in os.environ.items()
           if k not in ("KAFKA_BOOTSTRAP_SERVERS", "PROCESSOR_TEST_BROKER") and not k.startswith(("PYTEST_", "XDIST"))}
    env.update({"CI": "true", "PATH": str(bin_dir)})
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "--collect-only", "-q",
                        "tests/unit/test_membership_codec.py"], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr
    said = p.stdout + p.stderr
    assert "CI runs the integration suite on Apache Kafka, which needs Java 17 and Maven on PATH" in said, said
    assert "PROCESSOR_TEST_BROKER=tansu" in said, said
