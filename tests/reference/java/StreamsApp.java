// A Java twin run as a real Kafka Streams application against a broker, beside `processor run`
// of its Python twin (tests/integration/test_kafka_streams_on_broker.py).
//
//   java -cp CLASSES:LIBS/* StreamsApp TWIN PARAMS_JSON BOOTSTRAP APPLICATION_ID STATE_DIR [KEY=VALUE...]
//
// TWIN "bench:<workload>" runs a workload of the peer benchmark (BenchTopologies), "interop:reader"
// reads topics another application wrote (InteropReader). KEY=VALUE
// settings override the defaults below. Runs until its stdin ends, then closes; prints its state
// changes, and a fatal error, on stderr.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

public final class StreamsApp {
    private StreamsApp() { }

    public static void main(final String[] args) throws Exception {
        final Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[2]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 300);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);
        for (int i = 5; i < args.length; i++) {
            final int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        final JsonNode params = new ObjectMapper().readTree(args[1]);
        final Topology topology = args[0].startsWith("bench:")
            ? BenchTopologies.build(args[0].substring(6), params, props)
            : args[0].equals("interop:reader") ? InteropReader.build(params, props)
            : Twins.build(args[0], params, props);
        final KafkaStreams streams = new KafkaStreams(topology, props);
        streams.setStateListener((now, before) -> {
            System.err.println("state " + before + " -> " + now);
            if (now == KafkaStreams.State.ERROR) {
                System.err.println("fatal: Kafka Streams stopped in ERROR");
                System.exit(1);   // the test sees the exit at once
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("fatal: " + e);
            e.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        while (System.in.read() != -1) {
            // until the test closes stdin
        }
        // "closed" only when every thread stopped within the time (flushed and committed)
        System.err.println(streams.close(Duration.ofSeconds(30)) ? "closed" : "close timed out");
    }
}
