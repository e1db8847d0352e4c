"""The ``processor`` command.

    processor demo [--bootstrap-servers B] [--records N]
    processor run MODULE:ATTR --bootstrap-servers B --application-id ID --state-dir DIR
                  [--processing-guarantee at_least_once|exactly_once] [--startup-timeout-s S]
                  [--config KEY=VALUE ...] [--config-file client.properties]
                  [--consumer-config | --producer-config | --admin-config KEY=VALUE ...]
                  [--schema-registry-url URL] [--schema-registry-config KEY=VALUE ...]
    processor backfill MODULE:ATTR ... (see ``add_backfill_arguments``)

Every flag can come from the environment instead: ``PROCESSOR_<FLAG_NAME>``
(``PROCESSOR_BOOTSTRAP_SERVERS``, ``PROCESSOR_CONFIG`` with one KEY=VALUE per line,
``PROCESSOR_TOPOLOGY`` for MODULE:ATTR); the command line wins.
    processor describe MODULE:ATTR
    processor broker [--port P] [--apache-kafka [--kafka-version V] [--nodes N] [--data-dir DIR]]

Errors the user can fix print one line on stderr, ``processor: error: <message>``, no traceback,
and exit with the code of their class (``ProcessorError.exit_code``, see ``processor.errors``):

    0    stopped cleanly (SIGTERM/SIGINT)
    1    anything unexpected (a bug: with its traceback), a store that cannot be opened
    2    configuration or usage: bad arguments, unresolvable MODULE:ATTR, missing topic,
         co-partitioned topics with different partition counts          (ConfigError, TopologyError)
    3    the broker did not answer within --startup-timeout-s            (BrokerUnreachable)
    4    the state directory is locked by another worker process         (StateDirLocked)
    5    local state does not match its changelog                        (ChangelogMismatch)
    6    a record failed under ``--on-error fail`` (did not deserialize,
         a user function raised, an output did not serialize or is too
         large), or an internal record this build cannot read           (RecordError)
    7    a Kafka read or write failed at run time (delivery, restore)    (KafkaIOError)
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

from processor.config import ON_ERROR_POLICIES, PROCESSING_GUARANTEES, StreamsConfig
from processor.errors import ConfigError, ProcessorError
from processor.kafka.client_config import ClientConfig, parse_pairs
from processor.runtime.apache_kafka import DEFAULT_VERSION as APACHE_KAFKA_VERSION


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
            if loaded is None or loaded.loader is None:
                raise ConfigError(f"cannot load {module_name!r}: not a Python file")
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
    from processor import __version__, _compiled
    ap.add_argument("--version", action="version",
                    version=f"processor {__version__}, per-record path: {_compiled.build_info()}")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default per command)")
    ap.add_argument("--log-format", choices=["text", "json"], default="text",
                    help="text (default) or json: one JSON object per line with the record's task, topic, "
                         "partition and offset where known")
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the example topology end to end (embedded local broker by default)")
    d.add_argument("--bootstrap-servers", help="use this Kafka instead of starting the local broker")
    d.add_argument("--records", type=int, default=2000)
    d.add_argument("--run-id", default=None, help="suffix of the demo's topics and application id "
                   "(default: the time); `processor backfill processor.demo:topology_from_env` with "
                   "DEMO_RUN=<run id> rebuilds its stores")
    d.add_argument("--describe", action="store_true",
                   help="also print the topology and every operator's counters")

    r = sub.add_parser("run", help="run a topology as a consumer-group worker")
    r.add_argument("topology", metavar="MODULE:ATTR")
    r.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (or bootstrap.servers in --config-file)")
    r.add_argument("--application-id", required=True)
    r.add_argument("--state-dir", required=True)
    r.add_argument("--commit-interval-ms", type=int, default=1000)
    r.add_argument("--on-error", choices=ON_ERROR_POLICIES, default="dlq",
                   help="what to do with a record that fails: it does not deserialize, a user function "
                        "raises, an output does not serialize or is too large (default: dlq: to "
                        "<application-id>-dlq; skip: count and log; fail: stop, exit 6)")
    add_client_arguments(r)
    add_topic_arguments(r)
    r.add_argument("--processing-guarantee", choices=PROCESSING_GUARANTEES,
                   default="at_least_once",
                   help="exactly_once: outputs, changelogs and input offsets of each commit in one "
                        "Kafka transaction (state is effectively once either way)")
    r.add_argument("--max-task-idle-ms", type=int, default=0, metavar="MS",
                   help="a task reading several partitions processes them in time order, waiting for a "
                        "partition known to have data; MS also waits that long for one that looks empty "
                        "(default 0; -1: never wait, process records as they are fetched), as Kafka "
                        "Streams' max.task.idle.ms (KIP-695)")
    r.add_argument("--startup-timeout-s", type=float, default=10.0, metavar="S",
                   help="give up (exit code 3) when the broker does not answer within S seconds "
                        "at start-up (default: 10)")
    r.add_argument("--static-membership", action="store_true",
                   help="join the group as a static member (group.instance.id from the worker id kept "
                        "in the state directory): a worker restarted within the session timeout gets "
                        "its partitions back without a rebalance; a stopped one keeps them until the "
                        "session timeout expires (docs/operations.md \"Static membership\")")
    r.add_argument("--state-block-cache-mb", type=int, default=None, metavar="MB",
                   help="RocksDB block cache shared by every task's database (default: 128)")
    r.add_argument("--state-write-buffer-mb", type=int, default=None, metavar="MB",
                   help="RocksDB write buffer (memtable) per column family of each task's database: "
                        "every store, and two small bookkeeping ones (default: RocksDB's 64; up to two "
                        "per column family exist at once)")
    r.add_argument("--http-port", type=int, default=None, metavar="PORT",
                   help="serve /metrics (Prometheus), /healthz, /readyz and interactive queries "
                        "(/stores/<store>/<key>) on this port (default: off; 0: any free port)")
    r.add_argument("--http-host", default=None,
                   help="the address --http-port listens on (default: 127.0.0.1; 0.0.0.0 when --application-server "
                        "names a host that is not a loopback one)")
    r.add_argument("--http-tls-cert", default=None, metavar="PEM",
                   help="serve HTTPS with this certificate (chain), with --http-tls-key")
    r.add_argument("--http-tls-key", default=None, metavar="PEM", help="the private key of --http-tls-cert")
    r.add_argument("--http-tls-client-ca", default=None, metavar="PEM",
                   help="mutual TLS: a client certificate that chains to these CAs authenticates /stores and "
                        "/metadata requests (the probes need none)")
    r.add_argument("--http-tls-ca", default=None, metavar="PEM",
                   help="the CAs other workers' certificates are checked against when this worker forwards a "
                        "query to them (default: the system's)")
    r.add_argument("--http-auth-token-file", default=None, metavar="FILE",
                   help="/stores and /metadata require 'Authorization: Bearer <the token in FILE>' (or a client "
                        "certificate with --http-tls-client-ca); workers forward queries with it")
    r.add_argument("--http-metrics-auth", action="store_true",
                   help="/metrics requires the same credentials (default: open, as /healthz and /readyz always are)")
    r.add_argument("--health-timeout-s", type=float, default=60.0, metavar="S",
                   help="/healthz answers 503 when the main loop has not iterated for S seconds (default: 60)")
    fl = r.add_argument_group("fleet", "several workers of one application (docs/fleet.md)")
    fl.add_argument("--num-standby-replicas", type=int, default=0, metavar="N",
                    help="keep each stateful task's stores warm on N other workers, so a failover reads "
                         "only the changelog tail (default: 0)")
    fl.add_argument("--acceptable-recovery-lag", type=int, default=10_000, metavar="RECORDS",
                    help="a task moves to a worker whose copy is more changelog records behind only after "
                         "a warm-up there (default: 10000)")
    fl.add_argument("--max-warmup-replicas", type=int, default=2, metavar="N",
                    help="warm-up copies kept at once over the fleet (default: 2)")
    fl.add_argument("--application-server", default=None, metavar="HOST:PORT",
                    help="where other workers and clients reach this worker's HTTP endpoint (--http-port): "
                         "any worker then answers queries for any key (default: none)")

    de = sub.add_parser("describe", help="print a topology's sub-topologies, processors and stores")
    de.add_argument("topology", metavar="MODULE:ATTR")
    de.add_argument("--application-id", help="name internal topics as this application's worker does")

    bf = sub.add_parser("backfill", help="rebuild a topology's stores from topic history with Spark, "
                                         "then `processor run` continues at the snapshot")
    add_backfill_arguments(bf)

    st = sub.add_parser("state", help="look inside a stopped worker's (or a backfill's) state directory")
    st_sub = st.add_subparsers(dest="state_command", required=True)
    for name, text in (("dump", "print the stores as JSON lines, decoded with the topology's serdes"),
                       ("stats", "print entries and bytes per task and store")):
        sp = st_sub.add_parser(name, help=text)
        sp.add_argument("topology", metavar="MODULE:ATTR")
        sp.add_argument("--application-id", required=True)
        sp.add_argument("--state-dir", required=True)
        if name == "dump":
            sp.add_argument("--store", default=None, help="only this store (column family)")
            sp.add_argument("--task", default=None, metavar="SUB_PARTITION",
                            help="only this task, e.g. 0_1 (global: the global tables)")
            sp.add_argument("--raw", action="store_true",
                            help="keys and values as hex, every column family (bookkeeping, host-local) too")

    b = sub.add_parser("broker", help="start a local broker on 127.0.0.1 and print its address: the embedded "
                                      "development broker (tansu), or Apache Kafka with --apache-kafka")
    b.add_argument("--port", type=int, default=None, help="the client port (default: a free one)")
    b.add_argument("--apache-kafka", action="store_true",
                   help="start Apache Kafka (KRaft) instead of tansu: its jars are fetched from Maven Central "
                        "once, with Maven, into ~/.cache/processor (needs Java 17 and Maven)")
    b.add_argument("--kafka-version", default=None, help=f"Apache Kafka's version (default {APACHE_KAFKA_VERSION})")
    b.add_argument("--nodes", type=int, default=1,
                   help="Apache Kafka nodes (3: replication factor 3, min.insync.replicas=2)")
    b.add_argument("--data-dir", default=None,
                   help="keep Apache Kafka's data and logs here (default: a temporary folder, removed at exit)")
    return ap


def add_backfill_arguments(bf: argparse.ArgumentParser) -> None:
    """The arguments of ``processor backfill`` (also ``python -m backfill``, for spark-submit)."""
    bf.add_argument("topology", metavar="MODULE:ATTR")
    bf.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (or bootstrap.servers in --config-file)")
    bf.add_argument("--application-id", required=True)
    bf.add_argument("--state-dir", default=None,
                    help="also leave the worker's layout here, on this (the driver's) machine; without it "
                         "the changelogs, commit records and group offsets the job writes are the hand-off "
                         "to a worker anywhere (it restores the stores from them)")
    bf.add_argument("--master", default=None, help="Spark master (default local[*]; ignored under spark-submit)")
    bf.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="Spark setting of the job's session (repeatable), as spark-submit --conf; under "
                         "spark-submit its own settings win")
    bf.add_argument("--py-files", action="append", default=[], metavar="PATH",
                    help="more Python code for the executors (.py, .zip, .egg or a package directory; "
                         "repeatable); the topology's own module is shipped without it")
    bf.add_argument("--executor-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="on a cluster master: how long to wait for the first executor before failing")
    bf.add_argument("--emit-outputs", action="store_true",
                    help="write the history's outputs to the sink topics (default: stores only)")
    bf.add_argument("--no-compaction", action="store_true",
                    help="replay every record of every source, even where a reduction to each key's last "
                         "changes provably ends the same (docs/backfill.md \"What it does\", step 4): to check one")
    bf.add_argument("--archive", action="append", default=[], metavar="TOPIC=PATH",
                    help="Parquet archive (Spark kafka schema) of records older than the topic's earliest offset")
    bf.add_argument("--force", action="store_true", help="replace existing state / ignore committed group offsets")
    bf.add_argument("--on-error", choices=ON_ERROR_POLICIES, default="dlq",
                    help="the worker's policy for a record that fails (see processor run --help)")
    bf.add_argument("--processing-guarantee", choices=PROCESSING_GUARANTEES,
                    default="at_least_once",
                    help="the guarantee of the worker that continues: under exactly_once the history "
                         "is read read_committed, as that worker reads it (an open transaction's "
                         "records are left to it)")
    add_client_arguments(bf)
    add_topic_arguments(bf)


def add_topic_arguments(p: argparse.ArgumentParser) -> None:
    """How internal topics are created (processor/kafka/internal_topics.py)."""
    p.add_argument("--replication-factor", type=int, default=None, metavar="N",
                   help="replication factor of the internal topics created (default: min(3, brokers))")
    for kind in ("changelog", "repartition", "foreign-key"):
        p.add_argument(f"--{kind}-topic-config", action="append", default=[], metavar="KEY=VALUE",
                       help=f"topic setting of the {kind} topics created (repeatable)")


def topic_settings_from_args(args) -> dict:
    """``replication_factor`` and ``topic_configs`` keyword arguments from the topic flags."""
    from processor.kafka.topic_kinds import check_kind_configs

    if args.replication_factor is not None and args.replication_factor < 1:
        raise ConfigError(f"--replication-factor must be at least 1, not {args.replication_factor}")
    configs = {kind: parse_pairs(getattr(args, f"{kind.replace('-', '_')}_topic_config"), f"--{kind}-topic-config")
               for kind in ("changelog", "repartition", "foreign-key")}
    return {"replication_factor": args.replication_factor,
            "topic_configs": check_kind_configs({k: v for k, v in configs.items() if v})}


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    """Kafka client settings for every client a command opens (processor/kafka/client_config.py)."""
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="librdkafka setting for every Kafka client (repeatable; security settings go here)")
    p.add_argument("--config-file", action="append", default=[], metavar="PATH",
                   help="Java .properties client settings (client.properties) for every Kafka client; "
                        "--config entries override it")
    for kind in ("consumer", "producer", "admin"):
        p.add_argument(f"--{kind}-config", action="append", default=[], metavar="KEY=VALUE",
                       help=f"librdkafka setting for {kind} clients only, over --config (repeatable)")
    p.add_argument("--schema-registry-url", default=None, metavar="URL",
                   help="Schema Registry of the topology's registry serdes (Serdes.avro(schema, registry=...)); "
                        "over the URL given in code and schema.registry.url of --config/--config-file")
    p.add_argument("--schema-registry-config", action="append", default=[], metavar="KEY=VALUE",
                   help="Schema Registry client setting (e.g. basic.auth.user.info=KEY:SECRET, ssl.ca.location=...) "
                        "or auto.register.schemas=true|false for outputs (repeatable; secrets are redacted in logs)")


def streams_config_from_args(args: argparse.Namespace, clients: ClientConfig) -> StreamsConfig:
    """The ``StreamsConfig`` of ``processor run`` / ``processor backfill``'s arguments (the
    worker's commit interval and idle time: their defaults for the backfill, which has no such
    flags), with the client settings of ``client_config_from_args``."""
    extra = {name: getattr(args, name) for name in ("commit_interval_ms", "max_task_idle_ms", "num_standby_replicas",
                                                    "acceptable_recovery_lag", "max_warmup_replicas",
                                                    "application_server") if hasattr(args, name)}
    return StreamsConfig(processing_guarantee=args.processing_guarantee, on_error=args.on_error, clients=clients,
                         **topic_settings_from_args(args), **extra)


def http_security_from_args(args: argparse.Namespace):
    """The ``HTTPSecurity`` of ``processor run``'s ``--http-tls-*``/``--http-auth-*`` flags (files
    read and checked here: a ``ConfigError``, exit code 2, before anything else starts)."""
    from processor.runtime.http_security import HTTPSecurity

    return HTTPSecurity(tls_cert=args.http_tls_cert, tls_key=args.http_tls_key, tls_client_ca=args.http_tls_client_ca,
                        tls_ca=args.http_tls_ca, auth_token_file=args.http_auth_token_file,
                        metrics_auth=args.http_metrics_auth)


def client_config_from_args(args):
    """The ClientConfig of the parsed arguments; fills ``args.bootstrap_servers`` from a config
    file's ``bootstrap.servers`` when the flag is absent (and refuses two different ones)."""
    from processor.kafka.client_config import build_client_config

    config = build_client_config(args.config_file, args.config, args.consumer_config,
                                 args.producer_config, args.admin_config,
                                 registry_url=args.schema_registry_url,
                                 registry_pairs=args.schema_registry_config)
    given = config.common.pop("bootstrap.servers", None)
    if given is not None:
        if not args.bootstrap_servers:
            args.bootstrap_servers = given
        elif given != args.bootstrap_servers:
            raise ConfigError(f"bootstrap.servers {given!r} in --config/--config-file differs from "
                              f"--bootstrap-servers {args.bootstrap_servers!r}")
    for kind in ("consumer", "producer", "admin"):
        if getattr(config, kind).pop("bootstrap.servers", None) is not None:
            raise ConfigError(f"--{kind}-config: set bootstrap.servers with --bootstrap-servers")
    if not args.bootstrap_servers:
        raise ConfigError("--bootstrap-servers is required (or bootstrap.servers in --config-file, "
                          "or PROCESSOR_BOOTSTRAP_SERVERS)")
    return config


def run_backfill_command(args) -> int:
    import backfill

    config = client_config_from_args(args)
    topology = resolve_topology(args.topology)
    if not config.is_empty():
        logging.getLogger("processor.backfill").info("Kafka client settings: %s", config.describe())
    report = backfill.run(topology, bootstrap_servers=args.bootstrap_servers,
                          application_id=args.application_id, state_dir=args.state_dir,
                          emit_outputs=args.emit_outputs, archives=parse_pairs(args.archive, "--archive"),
                          force=args.force, compaction=not args.no_compaction, master=args.master,
                          config=streams_config_from_args(args, config),
                          spark_conf=parse_pairs(args.conf, "--conf"),
                          py_files=[p for arg in args.py_files for p in arg.split(",") if p],
                          executor_timeout_s=args.executor_timeout)
    for line in report.lines():
        print(line, flush=True)
    return 0


ENV_PREFIX = "PROCESSOR_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def environment_variable(action: argparse.Action) -> str:
    """``--bootstrap-servers`` -> ``PROCESSOR_BOOTSTRAP_SERVERS``; a positional by its name."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    name = longs[0][2:] if longs else action.dest
    return ENV_PREFIX + name.upper().replace("-", "_")


def apply_environment(parser: argparse.ArgumentParser, environ) -> None:
    """Every flag of every command (and each command's MODULE:ATTR, ``PROCESSOR_TOPOLOGY``) takes
    its default from ``PROCESSOR_<FLAG_NAME>`` when set (containers, Kubernetes); a flag given
    on the command line wins, and a repeatable flag's entries (one per line of the variable)
    come before the command line's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                apply_environment(sub, environ)
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        name = environment_variable(action)
        if name not in environ:
            continue
        raw = environ[name]
        if isinstance(action, argparse._StoreTrueAction):
            if raw.strip().lower() not in _TRUE + _FALSE:
                raise ConfigError(f"{name}={raw!r}: expected true or false")
            action.default = raw.strip().lower() in _TRUE
        elif isinstance(action, argparse._AppendAction):
            action.default = [line for line in raw.splitlines() if line.strip()]
        else:
            if action.choices is not None and raw not in action.choices:
                raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(map(str, action.choices))}")
            action.default = raw            # argparse converts a string default with ``type``
            action.required = False
            if not action.option_strings:   # a positional: optional once the environment names it
                action.nargs = "?"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        apply_environment(parser, os.environ)
    except ConfigError as exc:
        print(f"processor: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    args = parser.parse_args(argv)
    level = args.log_level or ("INFO" if args.command in ("run", "backfill") else "WARNING")
    from processor import logs

    logs.configure(level, args.log_format)
    logging.getLogger("py4j").setLevel(max(logging.getLevelName(level), logging.WARNING))  # Spark's RPC chatter
    # kafka-python (the group membership client) logs every join at INFO; the worker logs what changed
    logging.getLogger("kafka").setLevel(max(logging.getLevelName(level), logging.WARNING))
    # its IO loop waits while the worker runs a rebalance callback, by design (membership.py): not a warning
    logging.getLogger("kafka.net.selector").setLevel(max(logging.getLevelName(level), logging.ERROR))
    # librdkafka chatter (connection retries) is noise next to our own one-line errors
    logging.getLogger("processor.kafka").setLevel(max(logging.getLevelName(level), logging.ERROR)
                                                  if args.command != "run" else level)
    try:
        if args.command == "demo":
            from processor.demo import run_demo

            return run_demo(args.bootstrap_servers, args.records, run_id=args.run_id, describe=args.describe)
        if args.command == "describe":
            topo = resolve_topology(args.topology)
            if args.application_id:
                topo = topo.for_application(args.application_id)
            print(topo.describe(), end="")
            return 0
        if args.command == "run":
            from processor.runtime.worker import Worker

            config = client_config_from_args(args)
            topology = resolve_topology(args.topology)
            if not config.is_empty():
                logging.getLogger("processor.worker").info("Kafka client settings: %s", config.describe())
            from processor.state.rocksdb import configure_memory

            configure_memory(args.state_block_cache_mb, args.state_write_buffer_mb)
            worker = Worker(topology, args.bootstrap_servers, args.application_id, args.state_dir,
                            config=streams_config_from_args(args, config),
                            startup_timeout_s=args.startup_timeout_s,
                            static_membership=args.static_membership, http_port=args.http_port,
                            http_host=args.http_host, health_timeout_s=args.health_timeout_s,
                            http_security=http_security_from_args(args))
            worker.run()
            logging.getLogger("processor.worker").info(
                "stopped after %d records; fetch gaps read again: %d, accepted: %d; counters: %s",
                worker.records_processed, worker.fetch_gaps_refetched, worker.fetch_gaps_accepted, worker.metrics())
            return 0
        if args.command == "state":
            from processor.runtime import state_inspect

            topology = resolve_topology(args.topology)
            if args.state_command == "dump":
                state_inspect.dump(topology, args.application_id, args.state_dir, store=args.store,
                                   task=args.task, raw=args.raw)
            else:
                for row in state_inspect.stats(topology, args.application_id, args.state_dir):
                    print(f"task {row['task']:<8} {row['store']:<48} {row['entries']:>10,} entries "
                          f"{row['bytes']:>14,} bytes")
            return 0
        if args.command == "backfill":
            return run_backfill_command(args)
        if args.command == "broker":
            from processor.runtime.apache_kafka import ApacheKafka
            from processor.runtime.local_broker import LocalBroker

            if not args.apache_kafka and (args.kafka_version or args.nodes != 1 or args.data_dir):
                raise ConfigError("--kafka-version, --nodes and --data-dir are settings of --apache-kafka")
            broker: LocalBroker | ApacheKafka
            if args.apache_kafka:
                broker = ApacheKafka(nodes=args.nodes, version=args.kafka_version or APACHE_KAFKA_VERSION,
                                     port=args.port, directory=args.data_dir)
            else:
                broker = LocalBroker(port=args.port)
            with broker:
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
