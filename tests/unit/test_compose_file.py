"""docker-compose.yml (issue 15 item 5): the services a deployment needs are there, each
``processor`` command in it is a real CLI invocation (parsed by the CLI's own parser, its
topology importable), the worker is health-checked on the port it serves and restarted on
failure, and Prometheus scrapes that port. No Docker here: the file is checked, not run."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from processor import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _processor_commands(command: str) -> list[list[str]]:
    """The ``processor ...`` invocations inside a service's ``sh -c "..."`` command."""
    inner = shlex.split(command)
    script = inner[-1] if inner[:2] == ["sh", "-c"] else command
    return [shlex.split(part)[1:] for part in re.split(r"&&|;", script) if shlex.split(part)[:1] == ["processor"]]


def test_services_and_images(compose):
    services = compose["services"]
    assert {"kafka", "schema-registry", "demo", "worker", "backfill", "prometheus"} <= set(services)
    for name, svc in services.items():
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", svc["image"]), (name, svc["image"])   # pinned tags
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"   # KRaft
    assert services["prometheus"]["profiles"] == ["monitoring"]


def test_every_processor_command_is_a_real_cli_invocation(compose, monkeypatch):
    parser = cli._parser()
    seen = {}
    for name, svc in compose["services"].items():
        for argv in _processor_commands(svc.get("command", "")):
            try:
                args = parser.parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"service {name}: `processor {' '.join(argv)}` is refused by the CLI ({exc})")
            seen[name] = args
            if getattr(args, "topology", None):
                for k, v in (svc.get("environment") or {}).items():
                    monkeypatch.setenv(k, str(v))
                cli.resolve_topology(args.topology)   # importable and builds
    assert seen["demo"].command == "demo"
    assert seen["worker"].command == "run" and seen["backfill"].command == "backfill"
    assert seen["worker"].application_id != seen["backfill"].application_id


def test_worker_is_health_checked_restarted_and_scraped(compose):
    worker = compose["services"]["worker"]
    (argv,) = _processor_commands(worker["command"])
    args = cli._parser().parse_args(argv)
    port = args.http_port
    assert port is not None
    assert f"localhost:{port}/healthz" in " ".join(worker["healthcheck"]["test"])
    assert worker["restart"] in ("on-failure", "unless-stopped", "always")
    # published on the host's loopback only, the stores behind a token (the probes and /metrics open)
    assert worker["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert args.http_host == "0.0.0.0" and args.http_auth_token_file and not args.http_metrics_auth
    assert f"> {args.http_auth_token_file}" in worker["command"]   # made at the first start
    prom = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"worker:{port}" in targets
