"""The ``processor`` command.

    processor demo [--bootstrap-servers B] [--records N]
    processor run MODULE:ATTR --bootstrap-servers B --application-id ID --state-dir DIR
                  [--processing-guarantee at_least_once|exactly_once] [--startup-timeout-s S]
    processor describe MODULE:ATTR
    processor broker [--port P]

Errors the user can fix print one line on stderr, ``processor: error: <message>``, no traceback,
and exit with the code of their class (``ProcessorError.exit_code``, see ``processor.errors``):

    0    stopped cleanly (SIGTERM/SIGINT)
    1    anything unexpected (a bug: with its traceback), a store that cannot be opened, output
         that cannot be delivered
    2    configuration or usage: bad arguments, unresolvable MODULE:ATTR, missing topic,
         co-partitioned topics with different partition counts          (ConfigError, TopologyError)
    3    the broker did not answer within --startup-timeout-s            (BrokerUnreachable)
    4    the state directory is locked by another worker process         (StateDirLocked)
    5    local state does not match its changelog                        (ChangelogMismatch)
    6    a record failed processing: a user function raised, or a record
         did not deserialize under ``--on-error fail``                   (RecordError)
    130  interrupted before the worker took over SIGINT
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import signal
import sys
import time

from processor.errors import ConfigError, ProcessorError


def resolve_topology(spec: str):
    """``MODULE:ATTR`` (or ``path/to/file.py:ATTR``) -> Topology; ATTR may be a zero-argument function."""
    from processor.topology import Topology

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:ATTR, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.exists(module_name):
                raise ConfigError(f"cannot load {module_name!r}: no such file")
            loaded = importlib.util.spec_from_file_location("_processor_app", module_name)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, Topology):
        if not callable(obj):
            raise ConfigError(f"{spec} is a {type(obj).__name__}, not a Topology or a function returning one")
        try:
            obj = obj()
        except Exception as exc:
            raise ConfigError(f"{spec}() raised {type(exc).__name__}: {exc}") from None
        if not isinstance(obj, Topology):
            raise ConfigError(f"{spec}() returned a {type(obj).__name__}, not a Topology")
    return obj


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="processor", description="Kafka-native stream processor")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default per command)")
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the example topology end to end (embedded local broker by default)")
    d.add_argument("--bootstrap-servers", help="use this Kafka instead of starting the local broker")
    d.add_argument("--records", type=int, default=2000)
    d.add_argument("--run-id", default=None, help="suffix of the demo's topics and application id "
                   "(default: the time); `processor backfill processor.demo:topology_from_env` with "
                   "DEMO_RUN=<run id> rebuilds its stores")

    r = sub.add_parser("run", help="run a topology as a consumer-group worker")
    r.add_argument("topology", metavar="MODULE:ATTR")
    r.add_argument("--bootstrap-servers", required=True)
    r.add_argument("--application-id", required=True)
    r.add_argument("--state-dir", required=True)
    r.add_argument("--commit-interval-ms", type=int, default=1000)
    r.add_argument("--on-error", choices=["dlq", "skip", "fail"], default="dlq",
                   help="what to do with a record that does not deserialize (default: dlq)")
    r.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra librdkafka consumer setting (repeatable)")
    r.add_argument("--processing-guarantee", choices=["at_least_once", "exactly_once"],
                   default="at_least_once",
                   help="exactly_once: outputs, changelogs and input offsets of each commit in one "
                        "Kafka transaction (state is effectively once either way)")
    r.add_argument("--startup-timeout-s", type=float, default=10.0, metavar="S",
                   help="give up (exit code 3) when the broker does not answer within S seconds "
                        "at start-up (default: 10)")

    de = sub.add_parser("describe", help="print a topology's sub-topologies, processors and stores")
    de.add_argument("topology", metavar="MODULE:ATTR")
    de.add_argument("--application-id", help="name internal topics as this application's worker does")

    bf = sub.add_parser("backfill", help="rebuild a topology's stores from topic history with Spark, "
                                         "then `processor run` continues at the snapshot")
    add_backfill_arguments(bf)

    b = sub.add_parser("broker", help="start the local development broker (tansu) and print its address")
    b.add_argument("--port", type=int, default=None)
    return ap


def add_backfill_arguments(bf: argparse.ArgumentParser) -> None:
    """The arguments of ``processor backfill`` (also ``python -m backfill``, for spark-submit)."""
    bf.add_argument("topology", metavar="MODULE:ATTR")
    bf.add_argument("--bootstrap-servers", required=True)
    bf.add_argument("--application-id", required=True)
    bf.add_argument("--state-dir", required=True)
    bf.add_argument("--master", default=None, help="Spark master (default local[*]; ignored under spark-submit)")
    bf.add_argument("--emit-outputs", action="store_true",
                    help="write the history's outputs to the sink topics (default: stores only)")
    bf.add_argument("--archive", action="append", default=[], metavar="TOPIC=PATH",
                    help="Parquet archive (Spark kafka schema) of records older than the topic's earliest offset")
    bf.add_argument("--force", action="store_true", help="replace existing state / ignore committed group offsets")
    bf.add_argument("--on-error", choices=["dlq", "skip", "fail"], default="dlq")
    bf.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE")


def run_backfill_command(args) -> int:
    import backfill

    topology = resolve_topology(args.topology)
    report = backfill.run(topology, bootstrap_servers=args.bootstrap_servers,
                          application_id=args.application_id, state_dir=args.state_dir,
                          emit_outputs=args.emit_outputs, archives=_kv(args.archive), force=args.force,
                          master=args.master, on_error=args.on_error,
                          consumer_config=_kv(args.consumer_config) or None)
    for line in report.lines():
        print(line, flush=True)
    return 0


def _kv(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {p!r}")
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = args.log_level or ("INFO" if args.command in ("run", "backfill") else "WARNING")
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # librdkafka chatter (connection retries) is noise next to our own one-line errors
    logging.getLogger("processor.kafka").setLevel(max(logging.getLevelName(level), logging.ERROR)
                                                  if args.command != "run" else level)
    try:
        if args.command == "demo":
            from processor.demo import run_demo

            return run_demo(args.bootstrap_servers, args.records, run_id=args.run_id)
        if args.command == "describe":
            topo = resolve_topology(args.topology)
            if args.application_id:
                topo = topo.for_application(args.application_id)
            print(topo.describe(), end="")
            return 0
        if args.command == "run":
            from processor.runtime.worker import Worker

            topology = resolve_topology(args.topology)
            worker = Worker(topology, args.bootstrap_servers, args.application_id, args.state_dir,
                            commit_interval_ms=args.commit_interval_ms, on_error=args.on_error,
                            consumer_config=_kv(args.consumer_config),
                            startup_timeout_s=args.startup_timeout_s,
                            processing_guarantee=args.processing_guarantee)
            worker.run()
            logging.getLogger("processor.worker").info(
                "stopped after %d records; counters: %s", worker.records_processed, worker.metrics())
            return 0
        if args.command == "backfill":
            return run_backfill_command(args)
        if args.command == "broker":
            from processor.runtime.local_broker import LocalBroker

            with LocalBroker(port=args.port) as broker:
                print(broker.bootstrap_servers, flush=True)
                stop = []
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, lambda *_: stop.append(1))
                while not stop:
                    time.sleep(0.2)
            return 0
    except ProcessorError as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"processor: error: {message}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
