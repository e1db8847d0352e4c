"""``--log-format json``: one JSON object per line, with the record's task, topic, partition,
offset and step where the code that logs knows them."""

import io
import json
import logging

import pytest

from processor import StreamsBuilder, cli, logs
from processor.testing import TopologyTestDriver


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_dead_lettered_record_is_logged_as_json_with_its_position(restore_logging):
    out = io.StringIO()
    logs.configure("INFO", "json", out)
    b = StreamsBuilder()
    b.table("t", store_name="t-store").filter(lambda k, v: v > 0).to_stream().to("out")
    with TopologyTestDriver(b.build(), application_id="app") as d:
        d.pipe_input("t", "a", 1, timestamp=1)
        d.pipe_raw("t", b"b", b"not json", timestamp=2)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    [warning] = [x for x in lines if x["level"] == "WARNING"]
    assert {k: warning[k] for k in ("logger", "task", "topic", "partition", "offset", "step")} == {
        "logger": "processor.task", "task": "0_0", "topic": "t", "partition": 0, "offset": 1,
        "step": "KTABLE-SOURCE-0000000000"}
    assert warning["message"].startswith("dead-lettered poison record to app-dlq: record t[0]@1")
    assert warning["time"].endswith("+00:00")


def test_text_is_the_default_and_an_exception_travels_in_json(restore_logging):
    out = io.StringIO()
    logs.configure("INFO", "text", out)
    logging.getLogger("processor.x").info("hello %s", "there")
    assert out.getvalue().rstrip().endswith(" INFO processor.x: hello there")
    out = io.StringIO()
    logs.configure("INFO", "json", out)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("processor.x").exception("failed")
    line = json.loads(out.getvalue())
    assert line["message"] == "failed" and "ValueError: boom" in line["exception"]
    with pytest.raises(ValueError, match="log format must be one of"):
        logs.configure("INFO", "xml")


def test_the_flag_and_its_environment_variable():
    parser = cli._parser()
    cli.apply_environment(parser, {"PROCESSOR_LOG_FORMAT": "json"})
    assert parser.parse_args(["describe", "m:t"]).log_format == "json"
    assert cli._parser().parse_args(["--log-format", "json", "describe", "m:t"]).log_format == "json"
