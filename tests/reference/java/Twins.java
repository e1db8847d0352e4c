// The Java twins of tests/reference/twins.py: the same topology under the same name, built with
// Kafka Streams' DSL. Values are strings of small integers unless a twin says otherwise; a
// joiner writes "left+right" with "null" for a missing side; a windowed result's key is
// "key@start-end". Keep each twin line for line beside its Python one.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.Stores;
import com.fasterxml.jackson.databind.JsonNode;

final class Twins {
    private Twins() { }

    static final Serde<String> S = Serdes.String();
    static final Serde<Long> L = Serdes.Long();
    static final Consumed<String, String> SS = Consumed.with(S, S);
    static final Produced<String, String> OUT_S = Produced.with(S, S);
    static final Produced<String, Long> OUT_L = Produced.with(S, L);

    @SuppressWarnings("unchecked")
    static Serde<Object> serde(final String name) {
        switch (name) {
            case "string": return (Serde<Object>) (Serde<?>) Serdes.String();
            case "long": return (Serde<Object>) (Serde<?>) Serdes.Long();
            case "integer": return (Serde<Object>) (Serde<?>) Serdes.Integer();
            case "double": return (Serde<Object>) (Serde<?>) Serdes.Double();
            default: throw new IllegalArgumentException("no serde named " + name);
        }
    }

    static int num(final String v) {
        return Integer.parseInt(v);
    }

    static String str(final Object o) {
        return o == null ? "null" : o.toString();
    }

    static final ValueJoiner<String, String, String> JOIN = (l, r) -> str(l) + "+" + str(r);

    static String windowedKey(final Windowed<String> wk) {
        return wk.key() + "@" + wk.window().start() + "-" + wk.window().end();
    }

    /** A topic's name in a run on a broker: the twin's name with the run's prefix (none in the driver). */
    static String topic(final JsonNode params, final String name) {
        return params.path("prefix").asText("") + name;
    }

    /** An output topic's name on a broker: "out_prefix" (default: the prefix) and the twin's name. */
    static String sink(final JsonNode params, final String name) {
        return params.path("out_prefix").asText(params.path("prefix").asText("")) + name;
    }

    static String letter(final String v) {
        return String.valueOf("abcdef".charAt(num(v) % 6));
    }

    static Topology build(final String name, final JsonNode params, final Properties props) {
        final StreamsBuilder b = new StreamsBuilder();
        final String how = params.has("how") ? params.get("how").asText() : "inner";
        switch (name) {
            case "stream_stateless": {
                final KStream<String, String> in = b.stream("in", SS);
                in.filter((k, v) -> v != null && num(v) % 3 != 0).mapValues(v -> v + "x").to("out-filtered", OUT_S);
                in.flatMapValues(v -> {
                    final List<String> r = new ArrayList<>();
                    if (v != null) {
                        for (int i = 0; i < num(v) % 3; i++) {
                            r.add(v + i);
                        }
                    }
                    return r;
                }).to("out-flat", OUT_S);
                in.filterNot((k, v) -> v == null).map((k, v) -> KeyValue.pair(v, k)).to("out-swapped", OUT_S);
                break;
            }
            case "stream_split_merge": {
                final KStream<String, String> in = b.stream("in", SS).filter((k, v) -> v != null);
                final var split = in.split(Named.as("s-"))
                    .branch((k, v) -> num(v) % 2 == 0, Branched.as("even"))
                    .branch((k, v) -> num(v) % 3 == 0, Branched.as("three"));
                final var branches = params.path("no_default").asBoolean(false)
                    ? split.noDefaultBranch() : split.defaultBranch(Branched.as("rest"));
                branches.get("s-even").mapValues(v -> v + "e")
                    .merge(branches.get("s-three").mapValues(v -> v + "t"))
                    .to("out-merged", OUT_S);
                if (params.path("no_default").asBoolean(false)) {
                    in.filter((k, v) -> num(v) % 2 != 0 && num(v) % 3 != 0).to("out-rest", OUT_S);
                } else {
                    branches.get("s-rest").to("out-rest", OUT_S);
                }
                break;
            }
            case "table_filter": {
                final KTable<String, String> table =
                    b.table("in", SS, Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("source"));
                (params.path("not").asBoolean(false) ? table.filterNot((k, v) -> num(v) % 2 == 0)
                                                     : table.filter((k, v) -> num(v) % 2 == 0))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "table_map_values": {
                b.table("in", SS).mapValues(v -> String.valueOf(num(v) % 4)).toStream().to("out", OUT_S);
                break;
            }
            case "stream_count": {
                b.stream("in", SS).groupByKey().count(Materialized.as("counts")).toStream().to("out", OUT_L);
                break;
            }
            case "stream_select_key_count": {
                b.stream(topic(params, "in"), SS).selectKey((k, v) -> v).groupByKey(Grouped.with(S, S))
                    .count(Materialized.as("counts")).toStream().to(sink(params, "out"), OUT_L);
                break;
            }
            case "stream_count_suppressed": {   // D12: Emit.every(10)'s counterpart, pinned, not a twin
                b.stream("in", SS).groupByKey().count()
                    .suppress(Suppressed.untilTimeLimit(Duration.ofMillis(10), Suppressed.BufferConfig.unbounded()))
                    .toStream().to("out", OUT_L);
                break;
            }
            case "stream_reduce_max":
            case "stream_reduce_max_on_update": {   // Kafka Streams forwards every update: Emit.on_update()
                b.stream("in", SS).groupByKey()
                    .reduce((a, v) -> String.valueOf(Math.max(num(a), num(v))), Materialized.as("maxima"))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "stream_aggregate_sum": {
                b.stream("in", SS).groupByKey()
                    .aggregate(() -> "0", (k, v, agg) -> String.valueOf(num(agg) + num(v)),
                        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("sums").withValueSerde(S))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "table_group_by_count": {
                b.table("in", SS).groupBy((k, v) -> KeyValue.pair(v, k), Grouped.with(S, S))
                    .count(Materialized.as("counts")).toStream().to("out", OUT_L);
                break;
            }
            case "table_group_by_aggregate": {
                b.table("in", SS).groupBy((k, v) -> KeyValue.pair(String.valueOf(num(v) % 3), v), Grouped.with(S, S))
                    .aggregate(() -> "0",
                        (k, v, agg) -> String.valueOf(num(agg) + num(v)),
                        (k, v, agg) -> String.valueOf(num(agg) - num(v)),
                        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("sums").withValueSerde(S))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "table_group_by_reduce": {
                b.table("in", SS).groupBy((k, v) -> KeyValue.pair(String.valueOf(num(v) % 3), v), Grouped.with(S, S))
                    .reduce((agg, v) -> String.valueOf(num(agg) + num(v)), (agg, v) -> String.valueOf(num(agg) - num(v)),
                        Materialized.as("sums"))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "stream_to_table": {
                b.stream("in", SS).mapValues(v -> v == null ? null : String.valueOf(num(v) % 2))
                    .toTable(Materialized.as("latest")).toStream().to("out", OUT_S);
                break;
            }
            case "stream_table_join": {
                final KStream<String, String> left = b.stream(topic(params, "left"), SS);
                final KTable<String, String> right = b.table(topic(params, "right"), SS);
                (how.equals("left") ? left.leftJoin(right, JOIN) : left.join(right, JOIN)).to(sink(params, "out"), OUT_S);
                break;
            }
            case "table_table_join": {
                final KTable<String, String> left = b.table("left", SS);
                final KTable<String, String> right = b.table("right", SS);
                final KTable<String, String> joined;
                switch (how) {
                    case "left": joined = left.leftJoin(right, JOIN); break;
                    case "outer": joined = left.outerJoin(right, JOIN); break;
                    default: joined = left.join(right, JOIN);
                }
                joined.toStream().to("out", OUT_S);
                break;
            }
            case "stream_stream_join": {
                final KStream<String, String> left = b.stream("left", SS);
                final KStream<String, String> right = b.stream("right", SS);
                final JoinWindows w = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(10), Duration.ofMillis(5));
                final StreamJoined<String, String, String> sj = StreamJoined.with(S, S, S);
                final KStream<String, String> joined;
                switch (how) {
                    case "left": joined = left.leftJoin(right, JOIN, w, sj); break;
                    case "outer": joined = left.outerJoin(right, JOIN, w, sj); break;
                    default: joined = left.join(right, JOIN, w, sj);
                }
                joined.to("out", OUT_S);
                break;
            }
            case "fk_join": {
                // "left_cache": false (Kafka Streams only, for D10): the left table without its
                // record cache, so a subscription leaves at once instead of at the next commit
                final KTable<String, String> left = params.path("left_cache").asBoolean(true)
                    ? b.table(topic(params, "left"), SS)
                    : b.table(topic(params, "left"), SS,
                        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>with(S, S).withCachingDisabled());
                final KTable<String, String> right = b.table(topic(params, "right"), SS);
                final KTable<String, String> joined = how.equals("left")
                    ? left.leftJoin(right, Twins::letter, JOIN)
                    : left.join(right, Twins::letter, JOIN);
                joined.toStream().to(sink(params, "out"), OUT_S);
                break;
            }
            case "global_join": {
                final KStream<String, String> left = b.stream("left", SS);
                final GlobalKTable<String, String> right = b.globalTable("right", SS);
                // no mapped key for a null value or a multiple of 4
                final var mapper = (org.apache.kafka.streams.kstream.KeyValueMapper<String, String, String>)
                    (k, v) -> v == null || num(v) % 4 == 0 ? null : letter(v);
                (how.equals("left") ? left.leftJoin(right, mapper, JOIN) : left.join(right, mapper, JOIN))
                    .to("out", OUT_S);
                break;
            }
            case "tumbling_count": {
                b.stream(topic(params, "in"), SS).groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to(sink(params, "out"), OUT_L);
                break;
            }
            case "hopping_count": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5))
                        .advanceBy(Duration.ofMillis(5)))
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "session_count": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)))
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "sliding_count": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(params.path("grace").asLong(5) == 0
                        ? SlidingWindows.ofTimeDifferenceWithNoGrace(Duration.ofMillis(params.path("diff").asLong(10)))
                        : SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(params.path("diff").asLong(10)),
                            Duration.ofMillis(params.path("grace").asLong(5))))
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "stream_group_by_reduce": {
                b.stream("in", SS).groupBy((k, v) -> v == null ? "n" : String.valueOf(num(v) % 3), Grouped.with(S, S))
                    .reduce((a, v) -> String.valueOf(num(a) + num(v)), Materialized.as("sums"))
                    .toStream().to("out", OUT_S);
                break;
            }
            case "stream_repartition_count": {
                b.stream("in", SS).repartition(Repartitioned.with(S, S).withName("rep")).groupByKey()
                    .count(Materialized.as("counts")).toStream().to("out", OUT_L);
                break;
            }
            case "tumbling_aggregate": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .aggregate(() -> "", (k, v, agg) -> agg + (v == null ? "n" : v), Materialized.with(S, S))
                    .toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_S);
                break;
            }
            case "session_aggregate": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)))
                    .aggregate(() -> "", (k, v, agg) -> agg + (v == null ? "n" : v), (k, a, o) -> a + "|" + o,
                        Materialized.with(S, S))
                    .toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_S);
                break;
            }
            case "sliding_reduce": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .reduce((a, v) -> String.valueOf(Math.max(num(a), num(v))))
                    .toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_S);
                break;
            }
            case "table_join_derived": {
                final KTable<String, String> left = b.table("left", SS).filter((k, v) -> num(v) % 3 != 0);
                final KTable<String, String> right = b.table("right", SS).mapValues(v -> String.valueOf(num(v) * 2));
                left.join(right, JOIN).toStream().to("out", OUT_S);
                break;
            }
            case "stream_self_join": {
                final KStream<String, String> in = b.stream("in", SS);
                in.join(in, JOIN, JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)),
                    StreamJoined.with(S, S, S)).to("out", OUT_S);
                break;
            }
            case "number_serdes": {
                final KStream<Integer, Long> in = b.stream(topic(params, "in"), Consumed.with(Serdes.Integer(), Serdes.Long()));
                in.filter((k, v) -> v != null).mapValues(v -> v * 1.5)
                    .to(sink(params, "out-scaled"), Produced.with(Serdes.Integer(), Serdes.Double()));
                in.groupByKey(Grouped.with(Serdes.Integer(), Serdes.Long())).reduce(Long::sum)
                    .toStream().to(sink(params, "out-sum"), Produced.with(Serdes.Integer(), Serdes.Long()));
                break;
            }
            case "extractor_count": {
                b.stream("in", Consumed.with(S, S).withTimestampExtractor((rec, partitionTime) ->
                        rec.value() == null ? rec.timestamp() : rec.timestamp() + 3 * Long.parseLong((String) rec.value())))
                    .groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "topic_extractor": {
                b.stream("in", SS).filter((k, v) -> v != null)
                    .to((k, v, ctx) -> num(v) % 2 == 0 ? "out-even" : "out-odd", OUT_S);
                break;
            }
            case "papi_store_punctuate": {
                b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("sums"), S, L));
                b.stream("in", SS).process(SumsAndTotals::new, "sums").to("out", OUT_S);
                break;
            }
            case "session_count_retention": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)))
                    .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("sessions")
                        .withRetention(Duration.ofMillis(params.get("retention").asLong())))
                    .toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "windowed_keys_raw": {
                b.stream(topic(params, "in"), SS).groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .count().toStream().to(sink(params, "out"), Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, 10), L));
                break;
            }
            case "session_keys_raw": {
                b.stream(topic(params, "in"), SS).groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)))
                    .count().toStream().to(sink(params, "out"), Produced.with(WindowedSerdes.sessionWindowedSerdeFrom(String.class), L));
                break;
            }
            case "stream_flat_map": {
                b.stream("in", SS).peek((k, v) -> { })
                    .flatMap((k, v) -> {
                        final List<KeyValue<String, String>> r = new ArrayList<>();
                        if (v != null) {
                            for (int i = 0; i <= num(v) % 3; i++) {
                                r.add(KeyValue.pair(k + i, v));
                            }
                        }
                        return r;
                    })
                    .groupByKey().count().toStream().to("out", OUT_L);
                break;
            }
            case "tumbling_count_on_window_close": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)))
                    .emitStrategy(EmitStrategy.onWindowClose())
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            case "session_count_on_window_close": {
                b.stream("in", SS).groupByKey()
                    .windowedBy(SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)))
                    .emitStrategy(EmitStrategy.onWindowClose())
                    .count().toStream().map((wk, v) -> KeyValue.pair(windowedKey(wk), v)).to("out", OUT_L);
                break;
            }
            default:
                throw new IllegalArgumentException("no Java twin named " + name);
        }
        if (params.has("optimize") && params.get("optimize").asBoolean()) {
            props.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        }
        return b.build(props);
    }

    /** papi_store_punctuate: a running sum per key in a store, forwarded as "key=sum" with each
     * record, and every 10 ms of stream time the total of all sums as ("total", total). */
    static final class SumsAndTotals implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, Long> sums;

        @Override
        public void init(final ProcessorContext<String, String> context) {
            this.context = context;
            this.sums = context.getStateStore("sums");
            context.schedule(Duration.ofMillis(10), PunctuationType.STREAM_TIME, t -> {
                long total = 0;
                try (KeyValueIterator<String, Long> it = sums.all()) {
                    while (it.hasNext()) {
                        total += it.next().value;
                    }
                }
                context.forward(new Record<>("total", String.valueOf(total), t));
            });
        }

        @Override
        public void process(final Record<String, String> record) {
            if (record.key() == null || record.value() == null) {
                return;
            }
            final Long old = sums.get(record.key());
            final long sum = (old == null ? 0 : old) + num(record.value());
            sums.put(record.key(), sum);
            context.forward(record.withValue(record.key() + "=" + sum));
        }
    }
}
