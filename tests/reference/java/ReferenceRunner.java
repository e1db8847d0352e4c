// Runs the Java twins of the differential suite in Kafka Streams' own TopologyTestDriver.
//
//   java -cp CLASSES:LIBS/* ReferenceRunner REQUEST.json ANSWER.json
//   java -cp CLASSES:LIBS/* ReferenceRunner --serve     (a request per line on stdin, an answer
//                                                       per line on stdout, until stdin ends)
//
// REQUEST: {"cases": [{"id", "topology", "params", "steps", "read", "stores"}]}
//   steps: {"topic", "key", "value", "ts"} (key and value base64, or null) or {"advance": ms}
//     (the wall clock); read: [{"topic"}]; stores: [{"name", "key", "value"}] (serde names).
// ANSWER: {"cases": [{"id", "outputs": {topic: [[key, value, ts, step]...]}, "stores": {name: [[k, v]...]},
//   "error": null or the exception's text}]}, bytes as base64.
// One JVM runs every case of a request, each in a fresh driver. Nothing here decides what is
// right: pytest compares (tests/reference/).

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.test.TestRecord;

public final class ReferenceRunner {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder UNB64 = Base64.getDecoder();

    public static void main(final String[] args) throws Exception {
        if (args.length == 1 && args[0].equals("--serve")) {
            final PrintStream answers = System.out;
            System.setOut(System.err);   // nothing but answers on the answers' stream
            final BufferedReader requests = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = requests.readLine()) != null) {
                answers.println(JSON.writeValueAsString(answer(JSON.readTree(line))));
                answers.flush();
            }
            return;
        }
        JSON.writeValue(new File(args[1]), answer(JSON.readTree(new File(args[0]))));
    }

    static ObjectNode answer(final JsonNode request) {
        final ObjectNode answer = JSON.createObjectNode();
        final ArrayNode cases = answer.putArray("cases");
        for (final JsonNode c : request.get("cases")) {
            cases.add(runCase(c));
        }
        return answer;
    }

    private static byte[] bytes(final JsonNode node) {
        return node == null || node.isNull() ? null : UNB64.decode(node.asText());
    }

    private static String text(final byte[] b) {
        return b == null ? null : B64.encodeToString(b);
    }

    static ObjectNode runCase(final JsonNode c) {
        final ObjectNode out = JSON.createObjectNode();
        out.put("id", c.get("id").asText());
        final ObjectNode outputs = out.putObject("outputs");
        final ObjectNode stores = out.putObject("stores");
        out.putNull("error");
        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "test-app");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "dummy:1234");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // the JVM's own working directory (a temporary one per JVM): JVMs side by side share nothing
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("user.dir") + "/state");
        // no wall-clock throttle of the outer joins' and windowed aggregations' emission scans
        props.put(StreamsConfig.InternalConfig.EMIT_INTERVAL_MS_KSTREAMS_OUTER_JOIN_SPURIOUS_RESULTS_FIX, 0L);
        props.put(StreamsConfig.InternalConfig.EMIT_INTERVAL_MS_KSTREAMS_WINDOWED_AGGREGATION, 0L);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        final JsonNode params = c.get("params");
        final Topology topology;
        try {
            topology = Twins.build(c.get("topology").asText(), params, props);
        } catch (final RuntimeException e) {
            out.put("error", "the Java twin did not build: " + describe(e));
            return out;
        }
        try (TopologyTestDriver driver = new TopologyTestDriver(topology, props, Instant.ofEpochMilli(0))) {
            final Map<String, TestInputTopic<byte[], byte[]>> inputs = new HashMap<>();
            final Map<String, TestOutputTopic<byte[], byte[]>> readers = new HashMap<>();
            for (final JsonNode r : c.get("read")) {
                final String topic = r.asText();
                readers.put(topic, driver.createOutputTopic(topic, new ByteArrayDeserializer(), new ByteArrayDeserializer()));
                outputs.putArray(topic);
            }
            int index = 0;
            for (final JsonNode step : c.get("steps")) {
                if (step.has("advance")) {
                    driver.advanceWallClockTime(Duration.ofMillis(step.get("advance").asLong()));
                } else {
                    final String topic = step.get("topic").asText();
                    final TestInputTopic<byte[], byte[]> in = inputs.computeIfAbsent(topic,
                        t -> driver.createInputTopic(t, new ByteArraySerializer(), new ByteArraySerializer()));
                    in.pipeInput(new TestRecord<>(bytes(step.get("key")), bytes(step.get("value")), null,
                        step.get("ts").asLong()));
                }
                // drained after every step: the order across output topics is kept per topic only
                for (final Map.Entry<String, TestOutputTopic<byte[], byte[]>> r : readers.entrySet()) {
                    final ArrayNode list = (ArrayNode) outputs.get(r.getKey());
                    for (final TestRecord<byte[], byte[]> rec : r.getValue().readRecordsToList()) {
                        final ArrayNode row = list.addArray();
                        row.add(text(rec.key()));
                        row.add(text(rec.value()));
                        row.add(rec.timestamp());
                        row.add(index);
                    }
                }
                index++;
            }
            for (final JsonNode s : c.get("stores")) {
                final String name = s.get("name").asText();
                final Serde<Object> ks = Twins.serde(s.get("key").asText());
                final Serde<Object> vs = Twins.serde(s.get("value").asText());
                final KeyValueStore<Object, Object> store = driver.getKeyValueStore(name);
                final ArrayNode rows = stores.putArray(name);
                try (KeyValueIterator<Object, Object> it = store.all()) {
                    while (it.hasNext()) {
                        final KeyValue<Object, Object> kv = it.next();
                        final ArrayNode row = rows.addArray();
                        row.add(text(ks.serializer().serialize(name, kv.key)));
                        row.add(text(vs.serializer().serialize(name, kv.value)));
                    }
                }
            }
        } catch (final RuntimeException e) {
            out.put("error", describe(e));
        }
        return out;
    }

    private static String describe(final Throwable e) {
        // the exception and each cause, with the first frames of the innermost
        final StringBuilder b = new StringBuilder();
        Throwable t = e;
        while (t != null) {
            b.append(t == e ? "" : "caused by: ").append(t).append('\n');
            if (t.getCause() == null) {
                final StackTraceElement[] frames = t.getStackTrace();
                for (int i = 0; i < Math.min(frames.length, 6); i++) {
                    b.append("    at ").append(frames[i]).append('\n');
                }
            }
            t = t.getCause();
        }
        return b.toString();
    }
}
