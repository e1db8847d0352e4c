"""The Python twins of ``java/Twins.java``: the same topology under the same name.

Values are strings of small integers unless a twin says otherwise; a joiner writes
``"left+right"`` with ``"null"`` for a missing side; a windowed result's key is
``"key@start-end"``. Each twin declares its input topics (and which of them a global table
reads), its output topics with their serde names, and the key-value stores to compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processor import Emit, Processor, Record, Stores, StreamsBuilder
from processor.dsl.windows import JoinWindows, SessionWindows, SlidingWindows, TimeWindows
from processor.serde import Serdes
from processor.serde.windowed import SessionWindowedSerde
from processor.topology import Topology
from tests.reference import divergences

S = Serdes.string()
L = Serdes.long()
SERDES = {"string": S, "long": L, "integer": Serdes.integer(), "double": Serdes.double()}


def num(v: str) -> int:
    return int(v)


def text(o: Any) -> str:
    return "null" if o is None else str(o)


def join(left: Any, right: Any) -> str:
    return f"{text(left)}+{text(right)}"


def windowed_key(wk: Any, v: Any) -> tuple[str, Any]:
    return f"{wk.key}@{wk.start}-{wk.end}", v


def topic(p: dict, name: str) -> str:
    """A topic's name in a run on a broker: the twin's name with the run's prefix (none in the driver)."""
    return p.get("prefix", "") + name


def sink(p: dict, name: str) -> str:
    """An output topic's name on a broker: ``out_prefix`` (default: the prefix) and the twin's name."""
    return p.get("out_prefix", p.get("prefix", "")) + name


def letter(v: str) -> str:
    return "abcdef"[num(v) % 6]


@dataclass
class Twin:
    """A topology's Python side and what the suite needs to drive both sides."""

    name: str
    build: Callable[[dict[str, Any]], Topology]
    inputs: list[str]
    outputs: dict[str, str]                       # topic -> value serde name (keys: strings)
    stores: list[tuple[str, str, str]] = field(default_factory=list)   # (store, key serde, value serde)
    params: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    kinds: dict[str, str] = field(default_factory=dict)                # input topic -> "stream"/"table"/"global"
    rules: list[str] = field(default_factory=list)   # divergences.py's rules for every output
    topic_rules: dict[str, list[str]] = field(default_factory=dict)   # ... or for the outputs named
    row_time: Callable | None = None                  # ``row_time``'s stamp: (record, steps) -> ts
    unmatched: Callable | None = None                 # ``unmatched_timing``: value -> (side, value) if unmatched
    join_window: tuple[int, int, int] | None = None   # ``unmatched_timing``: (before, after, grace) in ms
    input_serdes: dict[str, tuple[str, str]] = field(default_factory=dict)   # topic -> (key, value) serde
    java_params: Callable[[dict], dict] | None = None   # the parameters the Java twin runs with, if others
    window_size: tuple[int, int] | None = None   # ``final_results_lost``: tumbling windows' (size, grace) in ms


TWINS: dict[str, Twin] = {}


def twin(name: str, inputs: list[str], outputs: dict[str, str], **kw: Any) -> Callable:
    def register(fn: Callable[[dict[str, Any]], Topology]) -> Callable:
        TWINS[name] = Twin(name, fn, inputs, outputs, **kw)
        return fn
    return register


@twin("stream_stateless", ["in"], {"out-filtered": "string", "out-flat": "string", "out-swapped": "string"})
def _stream_stateless(p: dict) -> Topology:
    b = StreamsBuilder()
    src = b.stream("in", key_serde=S, value_serde=S)
    src.filter(lambda k, v: v is not None and num(v) % 3 != 0).map_values(lambda v: v + "x").to(
        "out-filtered", S, S)
    src.flat_map_values(lambda v: [] if v is None else [f"{v}{i}" for i in range(num(v) % 3)]).to("out-flat", S, S)
    src.filter_not(lambda k, v: v is None).map(lambda k, v: (v, k)).to("out-swapped", S, S)
    return b.build()


@twin("stream_split_merge", ["in"], {"out-merged": "string", "out-rest": "string"},
      params=[{}, {"no_default": True}])
def _stream_split_merge(p: dict) -> Topology:
    """``split``, ``merge``, and ``no_default_branch`` (the rest then filtered from the source)."""
    b = StreamsBuilder()
    src = b.stream("in", key_serde=S, value_serde=S).filter(lambda k, v: v is not None)
    split = (src.split("s-")
             .branch(lambda k, v: num(v) % 2 == 0, name="even")
             .branch(lambda k, v: num(v) % 3 == 0, name="three"))
    if p.get("no_default"):
        branches = split.no_default_branch()
        src.filter(lambda k, v: num(v) % 2 != 0 and num(v) % 3 != 0).to("out-rest", S, S)
    else:
        branches = split.default_branch(name="rest")
        branches["s-rest"].to("out-rest", S, S)
    branches["s-even"].map_values(lambda v: v + "e").merge(
        branches["s-three"].map_values(lambda v: v + "t")).to("out-merged", S, S)
    return b.build()


@twin("table_filter", ["in"], {"out": "string"}, stores=[("source", "string", "string")],
      rules=["changes"], params=[{}, {"not": True}])
def _table_filter(p: dict) -> Topology:
    b = StreamsBuilder()
    table = b.table("in", key_serde=S, value_serde=S, store_name="source")
    (table.filter_not if p.get("not") else table.filter)(lambda k, v: num(v) % 2 == 0).to_stream().to("out", S, S)
    return b.build()


@twin("table_map_values", ["in"], {"out": "string"},
      rules=["changes"])
def _table_map_values(p: dict) -> Topology:
    b = StreamsBuilder()
    b.table("in", key_serde=S, value_serde=S).map_values(lambda v: str(num(v) % 4)).to_stream().to("out", S, S)
    return b.build()


@twin("stream_count", ["in"], {"out": "long"}, stores=[("counts", "string", "long")])
def _stream_count(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().count(name="counts", value_serde=L).to_stream().to(
        "out", S, L)
    return b.build()


@twin("stream_select_key_count", ["in"], {"out": "long"}, stores=[("counts", "string", "long")])
def _stream_select_key_count(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream(topic(p, "in"), key_serde=S, value_serde=S).select_key(lambda k, v: v).group_by_key(S, S).count(
        name="counts", value_serde=L).to_stream().to(sink(p, "out"), S, L)
    return b.build()


@twin("stream_reduce_max", ["in"], {"out": "string"}, stores=[("maxima", "string", "string")],
      rules=["changes_ts"])
def _stream_reduce_max(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().reduce(
        lambda a, v: str(max(num(a), num(v))), name="maxima").to_stream().to("out", S, S)
    return b.build()


@twin("stream_reduce_max_on_update", ["in"], {"out": "string"}, stores=[("maxima", "string", "string")])
def _stream_reduce_max_on_update(p: dict) -> Topology:
    """``Emit.on_update()``: every update forwarded, no-ops too, as Kafka Streams does (no rule)."""
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().reduce(
        lambda a, v: str(max(num(a), num(v))), name="maxima", emit=Emit.on_update()).to_stream().to("out", S, S)
    return b.build()


@twin("stream_aggregate_sum", ["in"], {"out": "string"}, stores=[("sums", "string", "string")],
      rules=["changes_ts"])
def _stream_aggregate_sum(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().aggregate(
        lambda: "0", lambda k, v, agg: str(num(agg) + num(v)), name="sums", value_serde=S).to_stream().to("out", S, S)
    return b.build()


@twin("table_group_by_count", ["in"], {"out": "long"}, stores=[("counts", "string", "long")],
      rules=["changes_ts"])
def _table_group_by_count(p: dict) -> Topology:
    b = StreamsBuilder()
    b.table("in", key_serde=S, value_serde=S).group_by(lambda k, v: (v, k), S, S).count(
        name="counts", value_serde=L).to_stream().to("out", S, L)
    return b.build()


@twin("table_group_by_aggregate", ["in"], {"out": "string"}, stores=[("sums", "string", "string")],
      rules=["changes_ts"])
def _table_group_by_aggregate(p: dict) -> Topology:
    b = StreamsBuilder()
    b.table("in", key_serde=S, value_serde=S).group_by(lambda k, v: (str(num(v) % 3), v), S, S).aggregate(
        lambda: "0", lambda k, v, agg: str(num(agg) + num(v)), lambda k, v, agg: str(num(agg) - num(v)),
        name="sums", value_serde=S).to_stream().to("out", S, S)
    return b.build()


@twin("table_group_by_reduce", ["in"], {"out": "string"}, stores=[("sums", "string", "string")],
      rules=["changes_ts"])
def _table_group_by_reduce(p: dict) -> Topology:
    b = StreamsBuilder()
    b.table("in", key_serde=S, value_serde=S).group_by(lambda k, v: (str(num(v) % 3), v), S, S).reduce(
        lambda agg, v: str(num(agg) + num(v)), lambda agg, v: str(num(agg) - num(v)),
        name="sums").to_stream().to("out", S, S)
    return b.build()


@twin("stream_to_table", ["in"], {"out": "string"}, stores=[("latest", "string", "string")],
      rules=["changes"])
def _stream_to_table(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).map_values(lambda v: None if v is None else str(num(v) % 2)).to_table(
        name="latest", key_serde=S, value_serde=S).to_stream().to("out", S, S)
    return b.build()


@twin("stream_table_join", ["left", "right"], {"out": "string"}, params=[{"how": "inner"}, {"how": "left"}],
      kinds={"left": "stream", "right": "table"})
def _stream_table_join(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.stream(topic(p, "left"), key_serde=S, value_serde=S)
    right = b.table(topic(p, "right"), key_serde=S, value_serde=S)
    (left.left_join if p["how"] == "left" else left.join)(right, join).to(sink(p, "out"), S, S)
    return b.build()


def _pk_join_time(rec: tuple, steps: list[tuple], kip557: bool, params: dict) -> int:
    """A primary-key join result's timestamp: the max of the triggering record's and the other
    side's row (as this project keeps it, or Kafka Streams: ``divergences.rows_by_step``)."""
    topic, _k, _v, ts = steps[rec[3]]
    other = "right" if topic == "left" else "left"
    row = divergences.rows_by_step(steps[:rec[3] + 1], {other}, kip557)[-1][other].get(rec[0])
    return ts if row is None else max(ts, row[1])


@twin("table_table_join", ["left", "right"], {"out": "string"},
      params=[{"how": "inner"}, {"how": "left"}, {"how": "outer"}], kinds={"left": "table", "right": "table"},
      rules=["row_time"], row_time=_pk_join_time)
def _table_table_join(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.table("left", key_serde=S, value_serde=S)
    right = b.table("right", key_serde=S, value_serde=S)
    how = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[p["how"]]
    how(right, join).to_stream().to("out", S, S)
    return b.build()


def _unmatched(v: bytes | None) -> tuple[str, bytes] | None:
    """An unmatched join result's side and value (``"v+null"``: left, ``"null+v"``: right), else None."""
    if v is None:
        return None
    if v.endswith(b"+null"):
        return "left", v[:-5]
    if v.startswith(b"null+"):
        return "right", v[5:]
    return None


@twin("stream_stream_join", ["left", "right"], {"out": "string"},
      params=[{"how": "inner"}, {"how": "left"}, {"how": "outer"}], kinds={"left": "stream", "right": "stream"},
      rules=["unmatched_timing"], unmatched=_unmatched, join_window=(10, 10, 5))
def _stream_stream_join(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.stream("left", key_serde=S, value_serde=S)
    right = b.stream("right", key_serde=S, value_serde=S)
    how = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[p["how"]]
    how(right, join, JoinWindows.of(10).grace(5)).to("out", S, S)
    return b.build()


def _fk_join_time(rec: tuple, steps: list[tuple], kip557: bool, params: dict) -> int:
    """A foreign-key join result's timestamp: a left record's and its right row's max (the row as
    this project or Kafka Streams keeps it), a right record's own. A left delete: its own here
    and in Kafka Streams' left join; in its inner join also maxed with the right row of the
    deleted row's foreign key, as its response comes back from the right side (D8)."""
    topic, k, v, ts = steps[rec[3]]
    if topic == "right":
        return ts
    if v is None:
        if kip557 or params.get("how") == "left":
            return ts
        old = divergences.rows_by_step(steps[:rec[3]], {"left"}, kip557)[-1]["left"].get(k) if rec[3] else None
        if old is None:
            return ts
        v = old[0]
    right = divergences.rows_by_step(steps[:rec[3] + 1], {"right"}, kip557)[-1]["right"]
    row = right.get(letter(v.decode()).encode())
    return ts if row is None else max(ts, row[1])


@twin("fk_join", ["left", "right"], {"out": "string"}, params=[{"how": "inner"}, {"how": "left"}],
      kinds={"left": "table", "right": "table"}, rules=["row_time"], row_time=_fk_join_time)
def _fk_join(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.table(topic(p, "left"), key_serde=S, value_serde=S)
    right = b.table(topic(p, "right"), key_serde=S, value_serde=S)
    left.join_on_foreign_key(right, letter, join, how=p["how"]).to_stream().to(sink(p, "out"), S, S)
    return b.build()


@twin("global_join", ["left", "right"], {"out": "string"}, params=[{"how": "inner"}, {"how": "left"}],
      kinds={"left": "stream", "right": "global"})
def _global_join(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.stream("left", key_serde=S, value_serde=S)
    right = b.global_table("right", key_serde=S, value_serde=S)

    def mapper(k: Any, v: Any) -> str | None:   # no mapped key for a null value or a multiple of 4
        return None if v is None or num(v) % 4 == 0 else letter(v)
    (left.left_join if p["how"] == "left" else left.join)(right, join, key_selector=mapper).to("out", S, S)
    return b.build()


def _windowed(name: str, windows: Any, rules: list[str] | None = None, params: list[dict] | None = None) -> Callable:
    @twin(name, ["in"], {"out": "long"}, rules=rules or [], params=params or [{}])
    def build(p: dict) -> Topology:
        b = StreamsBuilder()
        w = windows(p) if callable(windows) else windows
        b.stream(topic(p, "in"), key_serde=S, value_serde=S).group_by_key().windowed_by(w).count(
            value_serde=L).to_stream().map(windowed_key).to(sink(p, "out"), S, L)
        return b.build()
    return build


_windowed("tumbling_count", TimeWindows.of(10).grace(5))
_windowed("hopping_count", TimeWindows.of(10).advance_by(5).grace(5))
_windowed("session_count", SessionWindows.with_inactivity_gap(5).grace(3), ["session_rewrite", "changes"])
_windowed("sliding_count", lambda p: SlidingWindows.of_time_difference_and_grace(p["diff"], p["grace"]) if p["grace"]
          else SlidingWindows.of_time_difference_without_grace(p["diff"]), ["changes"],
          [{"diff": 10, "grace": 5}, {"diff": 3, "grace": 0}, {"diff": 2, "grace": 20}])


@twin("stream_group_by_reduce", ["in"], {"out": "string"}, stores=[("sums", "string", "string")],
      rules=["changes_ts"])
def _stream_group_by_reduce(p: dict) -> Topology:
    b = StreamsBuilder()
    grouped = b.stream("in", key_serde=S, value_serde=S).group_by(
        lambda k, v: "n" if v is None else str(num(v) % 3), S, S)
    grouped.reduce(lambda a, v: str(num(a) + num(v)), name="sums").to_stream().to("out", S, S)
    return b.build()


@twin("stream_repartition_count", ["in"], {"out": "long"}, stores=[("counts", "string", "long")])
def _stream_repartition_count(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).repartition(S, S, name="rep").group_by_key().count(
        name="counts", value_serde=L).to_stream().to("out", S, L)
    return b.build()


@twin("tumbling_aggregate", ["in"], {"out": "string"}, rules=["changes"])
def _tumbling_aggregate(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(TimeWindows.of(10).grace(5)).aggregate(
        lambda: "", lambda k, v, agg: agg + ("n" if v is None else v), value_serde=S).to_stream().map(
        windowed_key).to("out", S, S)
    return b.build()


@twin("session_aggregate", ["in"], {"out": "string"}, rules=["session_rewrite", "changes"])
def _session_aggregate(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(
        SessionWindows.with_inactivity_gap(5).grace(3)).aggregate(
        lambda: "", lambda k, v, agg: agg + ("n" if v is None else v), lambda k, a, o: f"{a}|{o}",
        value_serde=S).to_stream().map(windowed_key).to("out", S, S)
    return b.build()


@twin("sliding_reduce", ["in"], {"out": "string"}, rules=["changes"])
def _sliding_reduce(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(
        SlidingWindows.of_time_difference_and_grace(10, 5)).reduce(
        lambda a, v: str(max(num(a), num(v)))).to_stream().map(windowed_key).to("out", S, S)
    return b.build()


@twin("table_join_derived", ["left", "right"], {"out": "string"}, kinds={"left": "table", "right": "table"},
      rules=["row_time"], row_time=_pk_join_time)
def _table_join_derived(p: dict) -> Topology:
    b = StreamsBuilder()
    left = b.table("left", key_serde=S, value_serde=S).filter(lambda k, v: num(v) % 3 != 0)
    right = b.table("right", key_serde=S, value_serde=S).map_values(lambda v: str(num(v) * 2))
    left.join(right, join).to_stream().to("out", S, S)
    return b.build()


@twin("stream_self_join", ["in"], {"out": "string"}, params=[{"optimize": True}, {"optimize": False}],
      java_params=lambda p: {"optimize": False})   # D7: the rewrite keeps Kafka Streams' unoptimized results
def _stream_self_join(p: dict) -> Topology:
    b = StreamsBuilder()
    src = b.stream("in", key_serde=S, value_serde=S)
    src.join(src, join, JoinWindows.of(10).grace(5)).to("out", S, S)
    return b.build(optimize=p["optimize"])


@twin("number_serdes", ["in"], {"out-scaled": "double", "out-sum": "long"},
      input_serdes={"in": ("integer", "long")}, topic_rules={"out-sum": ["changes_ts"]})
def _number_serdes(p: dict) -> Topology:
    b = StreamsBuilder()
    src = b.stream(topic(p, "in"), key_serde=Serdes.integer(), value_serde=L)
    src.filter(lambda k, v: v is not None).map_values(lambda v: v * 1.5).to(
        sink(p, "out-scaled"), Serdes.integer(), Serdes.double())
    src.group_by_key(Serdes.integer(), L).reduce(lambda a, v: a + v, value_serde=L).to_stream().to(
        sink(p, "out-sum"), Serdes.integer(), L)
    return b.build()


@twin("extractor_count", ["in"], {"out": "long"})
def _extractor_count(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S,
             timestamp_extractor=lambda k, v, ts: ts if v is None else ts + 3 * int(v)).group_by_key().windowed_by(
        TimeWindows.of(10).grace(5)).count(value_serde=L).to_stream().map(windowed_key).to("out", S, L)
    return b.build()


@twin("topic_extractor", ["in"], {"out-even": "string", "out-odd": "string"})
def _topic_extractor(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).filter(lambda k, v: v is not None).to(
        lambda k, v: "out-even" if num(v) % 2 == 0 else "out-odd", S, S)
    return b.build()


class _SumsAndTotals(Processor):
    """papi_store_punctuate: a running sum per key in a store, forwarded as "key=sum" with each
    record, and every 10 ms of stream time the total of all sums as ("total", total)."""

    def init(self, context: Any) -> None:
        self.context = context
        self.sums = context.get_state_store("sums")
        context.schedule(10, "stream", self.total)

    def total(self, t: int) -> None:
        self.context.forward(Record("total", str(sum(v for _k, v in self.sums.all())), t))

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            return
        total = (self.sums.get(record.key) or 0) + num(record.value)
        self.sums.put(record.key, total)
        self.context.forward(record._replace(value=f"{record.key}={total}"))


@twin("papi_store_punctuate", ["in"], {"out": "string"}, stores=[("sums", "string", "long")])
def _papi_store_punctuate(p: dict) -> Topology:
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("sums", S, L))
    b.stream("in", key_serde=S, value_serde=S).process(_SumsAndTotals, stores=["sums"]).to("out", S, S)
    return b.build()


@twin("session_count_retention", ["in"], {"out": "long"}, rules=["session_rewrite", "changes"],
      params=[{"retention": 8}, {"retention": 20}, {"retention": 60}])
def _session_count_retention(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(
        SessionWindows.with_inactivity_gap(5).grace(3)).count(
        value_serde=L, retention_ms=p["retention"]).to_stream().map(windowed_key).to("out", S, L)
    return b.build()


@twin("windowed_keys_raw", ["in"], {"out": "long"})
def _windowed_keys_raw(p: dict) -> Topology:
    """Interoperability: a time-windowed key's bytes (``Serdes.windowed``: Kafka Streams' ``TimeWindowedSerde``)."""
    b = StreamsBuilder()
    b.stream(topic(p, "in"), key_serde=S, value_serde=S).group_by_key().windowed_by(TimeWindows.of(10).grace(5)).count(
        value_serde=L).to_stream().to(sink(p, "out"), Serdes.windowed(S, 10), L)
    return b.build()


@twin("session_keys_raw", ["in"], {"out": "long"}, rules=["session_rewrite", "changes"])
def _session_keys_raw(p: dict) -> Topology:
    """Interoperability: a session key's bytes (Kafka Streams' ``SessionWindowedSerde``)."""
    b = StreamsBuilder()
    b.stream(topic(p, "in"), key_serde=S, value_serde=S).group_by_key().windowed_by(
        SessionWindows.with_inactivity_gap(5).grace(3)).count(value_serde=L).to_stream().to(
        sink(p, "out"), SessionWindowedSerde(S), L)
    return b.build()


@twin("stream_flat_map", ["in"], {"out": "long"})
def _stream_flat_map(p: dict) -> Topology:
    """``peek``, ``flat_map`` (new keys: a repartition before the count)."""
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).peek(lambda k, v: None).flat_map(
        lambda k, v: [] if v is None else [(f"{text(k)}{i}", v) for i in range(num(v) % 3 + 1)]).group_by_key(
        S, S).count(value_serde=L).to_stream().to("out", S, L)
    return b.build()


@twin("tumbling_count_on_window_close", ["in"], {"out": "long"}, rules=["final_results_lost"], window_size=(10, 5))
def _tumbling_count_on_window_close(p: dict) -> Topology:
    """``Emit.on_window_close()`` against Kafka Streams' ``EmitStrategy.onWindowClose()``."""
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(TimeWindows.of(10).grace(5)).count(
        emit=Emit.on_window_close(), value_serde=L).to_stream().map(windowed_key).to("out", S, L)
    return b.build()


@twin("session_count_on_window_close", ["in"], {"out": "long"})
def _session_count_on_window_close(p: dict) -> Topology:
    b = StreamsBuilder()
    b.stream("in", key_serde=S, value_serde=S).group_by_key().windowed_by(
        SessionWindows.with_inactivity_gap(5).grace(3)).count(
        emit=Emit.on_window_close(), value_serde=L).to_stream().map(windowed_key).to("out", S, L)
    return b.build()
