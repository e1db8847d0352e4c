"""`processor` exit codes: one per error class (documented in processor.errors), returned by
cli.main with the error on one stderr line."""

import logging

import pytest

from processor import cli
from processor.errors import (
    BrokerUnreachable,
    ChangelogMismatch,
    ConfigError,
    DeserializationError,
    KafkaIOError,
    OutputError,
    ProcessingError,
    ProcessorError,
    RecordError,
    SchemaRegistryUnavailable,
    SerializationError,
    StateDirLocked,
    StateError,
    TopologyError,
    UserFunctionError,
)
from processor.runtime.collector import DeliveryFailed


@pytest.fixture(autouse=True)
def logging_as_before():
    """``cli.main`` configures logging for a process (the root logger's one handler, some levels):
    put back what pytest set up, or a later test's ``caplog`` sees nothing."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: lg.level for n, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            lg.setLevel(levels.get(n, logging.NOTSET))


def test_exit_code_per_class():
    assert {cls: cls.exit_code for cls in (ProcessorError, StateError, ConfigError, TopologyError,
                                           BrokerUnreachable, StateDirLocked, ChangelogMismatch,
                                           RecordError, ProcessingError, SerializationError,
                                           DeserializationError, UserFunctionError, OutputError,
                                           KafkaIOError, DeliveryFailed, SchemaRegistryUnavailable)} == {
        ProcessorError: 1, StateError: 1, ConfigError: 2, TopologyError: 2, BrokerUnreachable: 3,
        StateDirLocked: 4, ChangelogMismatch: 5, RecordError: 6, ProcessingError: 6,
        SerializationError: 6, DeserializationError: 6, UserFunctionError: 6, OutputError: 6,
        KafkaIOError: 7, DeliveryFailed: 7, SchemaRegistryUnavailable: 8}
    assert not issubclass(KafkaIOError, ConfigError)   # a failed read at run time is not bad usage
    assert issubclass(BrokerUnreachable, ConfigError)
    assert issubclass(StateDirLocked, StateError) and issubclass(ChangelogMismatch, StateError)


def run_args():
    return ["--log-level", "ERROR", "run", "m:t", "--bootstrap-servers", "127.0.0.1:1",
            "--application-id", "a", "--state-dir", "/nonexistent"]


def test_bad_module_attr_is_2(capsys):
    assert cli.main(["run", "just-a-module", "--bootstrap-servers", "x", "--application-id", "a",
                     "--state-dir", "/nonexistent"]) == 2
    assert capsys.readouterr().err == "processor: error: expected MODULE:ATTR, got 'just-a-module'\n"


@pytest.mark.parametrize("exc, code", [
    (StateDirLocked("state directory /s/a is locked by another worker (pid 1 on host h)"), 4),
    (ChangelogMismatch("task 0_1: local state at 10, changelog ends at 5"), 5),
    (ProcessingError("raised ValueError: bad\nvalue", topic="t", partition=0, offset=3, step="s"), 6),
    (KafkaIOError("task 0_1: 3 changelog record(s) failed delivery, first: t[0]: Broker: timed out"), 7),
    (SchemaRegistryUnavailable("the Schema Registry at http://r:8081 could not be used for 60.2 s"), 8),
    (ProcessorError("something else"), 1),
])
def test_main_returns_the_error_class_exit_code_on_one_line(monkeypatch, capsys, exc, code):
    def fail(spec):
        raise exc
    monkeypatch.setattr(cli, "resolve_topology", fail)
    assert cli.main(run_args()) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("processor: error: ")
    assert err.strip() == "processor: error: " + " ".join(str(exc).splitlines())


def test_state_memory_flags_reach_rocksdb_and_bad_sizes_are_2(monkeypatch, capsys):
    """``--state-block-cache-mb`` / ``--state-write-buffer-mb`` are handed to
    ``configure_memory`` before the worker starts; a size below 1 MB is a usage error."""
    from processor import StreamsBuilder
    from processor.runtime import worker as worker_module
    from processor.state import rocksdb

    b = StreamsBuilder()
    b.stream("in").to("out")
    monkeypatch.setattr(cli, "resolve_topology", lambda spec: b.build())
    seen = {}

    def no_worker(*args, **kwargs):
        seen.update(rocksdb._memory)
        raise ConfigError("stopped before any broker: the test only checks the settings")
    monkeypatch.setattr(worker_module, "Worker", no_worker)
    try:
        assert cli.main(run_args() + ["--state-block-cache-mb", "16", "--state-write-buffer-mb", "8"]) == 2
        assert seen == {"block_cache_mb": 16, "write_buffer_mb": 8}
        capsys.readouterr()
        assert cli.main(run_args() + ["--state-write-buffer-mb", "0"]) == 2
        assert "--state-write-buffer-mb must be at least 1" in capsys.readouterr().err
    finally:
        rocksdb.configure_memory()


def test_a_malformed_application_server_is_2_on_one_line(monkeypatch, capsys):
    """``--application-server`` that is not host:port: refused before any broker or state is touched."""
    from processor import StreamsBuilder
    from processor.runtime import worker as worker_module

    b = StreamsBuilder()
    b.stream("in").to("out")
    monkeypatch.setattr(cli, "resolve_topology", lambda spec: b.build())
    monkeypatch.setattr(worker_module, "Worker", lambda *a, **k: pytest.fail("a worker was made"))
    for given in ("worker-1", "worker-1:port", "http://worker-1:8080"):
        assert cli.main(run_args() + ["--http-port", "8080", "--application-server", given]) == 2
        assert capsys.readouterr().err == (
            f"processor: error: application_server must be host:port (the address other workers and clients use "
            f"to reach this worker's HTTP endpoint), not {given!r}\n")
