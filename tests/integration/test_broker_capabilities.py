"""The broker's transaction capabilities, probed (tests.support.broker_probe) and reported by
name: what exactly_once mode can rely on from this broker, and that the probe's answers are
stable and agree with what it observed."""

import time

from processor.runtime.local_broker import free_port
from tests.support.broker_probe import TransactionCapabilities, probe_transactions


def _with_prefix(details: dict[str, str], name: str) -> dict[str, str]:
    return {k[len(name) + 1:]: v for k, v in details.items() if k.startswith(name + ".")}


def test_capabilities_reported_and_transactions_supported(broker_capabilities, report):
    caps = broker_capabilities
    assert caps.names() == ["transactions_supported", "read_committed_hides_aborted",
                            "zombie_fenced", "send_offsets_to_transaction_supported",
                            "transactions_complete_after_fencing"]
    for line in caps.describe():
        report(line)
    assert caps.describe()[:5] == [f"{name}: {'yes' if value else 'no'}" for name, value in caps.as_dict().items()]
    # exactly_once mode needs transactions and offsets committed inside them.
    assert caps.transactions_supported, caps.details
    assert caps.send_offsets_to_transaction_supported, caps.details


def test_every_answer_agrees_with_what_the_probe_observed(broker_capabilities):
    caps = broker_capabilities
    for name in caps.names():
        assert _with_prefix(caps.details, name), f"{name}: no observation recorded"

    d = _with_prefix(caps.details, "transactions_supported")
    assert caps.transactions_supported == (d.get("committed_record_seen") == "yes" and "error" not in d)

    d = _with_prefix(caps.details, "read_committed_hides_aborted")
    assert caps.read_committed_hides_aborted == (
        "error" not in d and d.get("committed_record_seen") == "yes" and d.get("aborted_record_seen") == "no")
    if not caps.read_committed_hides_aborted and "error" not in d and d.get("committed_record_seen") == "yes":
        assert d["aborted_record_seen"] == "yes"

    d = _with_prefix(caps.details, "zombie_fenced")
    fenced = any(code in d.get("zombie_commit", "")
                 for code in ("raised _FENCED", "raised PRODUCER_FENCED", "raised INVALID_PRODUCER_EPOCH"))
    assert caps.zombie_fenced == (
        "error" not in d and fenced and d.get("zombie_record_seen", "").startswith("no"))

    d = _with_prefix(caps.details, "send_offsets_to_transaction_supported")
    assert caps.send_offsets_to_transaction_supported == (d.get("committed_offset") == "3 (sent 3)")

    d = _with_prefix(caps.details, "transactions_complete_after_fencing")
    assert caps.transactions_complete_after_fencing == (
        "error" not in d and d.get("committed_offsets") == "restarted producer 1 (sent 1), other producer 2 (sent 2)"
        and d.get("records_read_committed", "").startswith("yes"))


def test_probe_is_deterministic(broker_capabilities, kafka_bootstrap, report):
    t0 = time.monotonic()
    again = probe_transactions(kafka_bootstrap)
    report(f"second probe run: {time.monotonic() - t0:.2f} s")
    assert again.as_dict() == broker_capabilities.as_dict()
    assert again == broker_capabilities   # details are excluded from equality
    assert sorted(again.details) == sorted(broker_capabilities.details)


def test_unreachable_broker_answers_no_without_raising(report):
    t0 = time.monotonic()
    caps = probe_transactions(f"127.0.0.1:{free_port()}", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    report(f"unreachable broker: all five probes answered no in {elapsed:.2f} s")
    assert isinstance(caps, TransactionCapabilities)
    assert caps.as_dict() == {name: False for name in caps.names()}
    for name in caps.names():
        assert _with_prefix(caps.details, name).get("error"), caps.details
    assert elapsed < 5 * 1.0 + 5
