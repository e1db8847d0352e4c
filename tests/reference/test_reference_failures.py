"""When Kafka Streams cannot be run as the reference, the suite says which part failed and why,
and fails: a twin the Java side does not have, Java twins that do not compile, Maven Central
out of reach."""

from __future__ import annotations

import pytest

from processor import StreamsBuilder
from processor.serde import Serdes
from tests.reference import kafka_streams
from tests.reference.compare import case_of, compare, python_side
from tests.reference.twins import Twin


def _passthrough(p: dict):
    b = StreamsBuilder()
    b.stream("in", key_serde=Serdes.string(), value_serde=Serdes.string()).to("out")
    return b.build()


def test_a_twin_the_java_side_does_not_have_is_a_named_difference():
    twin = Twin("no_such_twin", _passthrough, ["in"], {"out": "string"})
    steps = [("in", b"a", b"1", 5)]
    theirs = kafka_streams.run_cases([case_of(twin, {}, steps, "x")])["x"]
    problems = compare(twin, python_side(twin, {}, steps), theirs, steps)
    assert len(problems) == 1
    assert "the Java twin did not build" in problems[0]
    assert "no Java twin named no_such_twin" in problems[0]


def test_java_twins_that_do_not_compile_name_javac_s_first_error(tmp_path, monkeypatch):
    (tmp_path / "Broken.java").write_text("final class Broken { int x = ; }\n")
    monkeypatch.setattr(kafka_streams, "SOURCES", tmp_path)
    with pytest.raises(kafka_streams.ReferenceUnavailable) as e:
        kafka_streams.compiled()
    text = str(e.value)
    assert "the Java twins did not compile against Kafka Streams 4.4.0" in text
    assert "Broken.java:1: error: illegal start of expression" in text


def test_maven_central_out_of_reach_is_named(tmp_path, monkeypatch):
    # Maven with an empty local repository whose every download goes to a closed loopback port
    home = tmp_path / "home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>closed</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>")
    monkeypatch.setenv("PROCESSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MAVEN_OPTS", f"-Duser.home={home} -Dmaven.repo.local={home / 'repo'}")
    with pytest.raises(kafka_streams.ReferenceUnavailable) as e:
        kafka_streams.classpath()
    text = str(e.value)
    assert text.startswith(f"Maven could not fetch Kafka Streams {kafka_streams.VERSION} from Maven Central")
    assert "the differential suite needs Kafka Streams itself" in text
    assert not (tmp_path / "cache" / f"kafka-streams-{kafka_streams.VERSION}" / "libs").exists()
