// Kafka Streams reading topics another application wrote (tests/integration/test_kafka_streams_interop.py):
// each topic of params "topics" ({source: {"key": serde, "value": serde, "out": topic}}) is read with
// those serdes, and its records written to "out" as text (string keys and values), timestamps kept.
// Serdes: string, integer, long, double, windowed10 (TimeWindowedSerde of strings, 10 ms windows),
// session (SessionWindowedSerde of strings). A windowed key's text is "key@start-end"; a null stays null.
// The Python side is tests/reference/on_broker.py's reader().

import com.fasterxml.jackson.databind.JsonNode;
import java.util.Iterator;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;

final class InteropReader {
    private InteropReader() { }

    /** Twins' serdes by name, and the two windowed ones. */
    @SuppressWarnings("unchecked")
    static Serde<Object> serde(final String name) {
        switch (name) {
            case "windowed10": return (Serde<Object>) (Serde<?>) WindowedSerdes.timeWindowedSerdeFrom(String.class, 10);
            case "session": return (Serde<Object>) (Serde<?>) WindowedSerdes.sessionWindowedSerdeFrom(String.class);
            default: return Twins.serde(name);
        }
    }

    static String text(final Object o) {
        if (o instanceof Windowed) {
            final Windowed<?> wk = (Windowed<?>) o;
            return wk.key() + "@" + wk.window().start() + "-" + wk.window().end();
        }
        return o == null ? null : String.valueOf(o);
    }

    static Topology build(final JsonNode params, final Properties props) {
        final StreamsBuilder b = new StreamsBuilder();
        final Iterator<Map.Entry<String, JsonNode>> topics = params.get("topics").fields();
        while (topics.hasNext()) {
            final Map.Entry<String, JsonNode> t = topics.next();
            b.stream(t.getKey(), Consumed.with(serde(t.getValue().get("key").asText()),
                                               serde(t.getValue().get("value").asText())))
                .map((k, v) -> KeyValue.pair(text(k), text(v)))
                .to(t.getValue().get("out").asText(), Produced.with(Serdes.String(), Serdes.String()));
        }
        return b.build(props);
    }
}
