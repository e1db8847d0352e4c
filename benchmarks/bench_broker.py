"""What the benchmarks here share: the broker a run uses, and the hidden arguments of a
benchmark that runs its worker in a child process (so that nothing of the loader is counted)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from processor.runtime.local_broker import LocalBroker  # noqa: E402


@contextlib.contextmanager
def broker(bootstrap_servers: str | None, apache_kafka: bool = False):
    """``bootstrap_servers``, or a local broker started for the run and stopped after it: Apache
    Kafka (one KRaft node, ``processor.runtime.apache_kafka``) with ``apache_kafka``, else Tansu."""
    if bootstrap_servers:
        yield bootstrap_servers
        return
    from processor.runtime.apache_kafka import ApacheKafka

    local: LocalBroker | ApacheKafka = ApacheKafka() if apache_kafka else LocalBroker()
    local.start()
    try:
        yield local.bootstrap_servers
    finally:
        local.stop()


def produce(p, topic: str, value, key, timestamp: int | None = None) -> None:
    """``p.produce`` that waits for room in the producer's queue instead of failing."""
    kw = {} if timestamp is None else {"timestamp": timestamp}
    while True:
        try:
            p.produce(topic, value, key, **kw)
            return
        except BufferError:
            p.poll(0.05)


def add_child_arguments(ap: argparse.ArgumentParser) -> None:
    """``--child`` (run the worker), with its input and output topics, application id and state."""
    for flag in ("--topic", "--out", "--app", "--state"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
