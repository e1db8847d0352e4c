// The peer benchmark's workloads (benchmarks/peers.py) as Kafka Streams topologies, for
// StreamsApp: the same topics, JSON values and results as benchmarks/peer_topologies.py.
//   orders              key order id,    value {"order_id", "customer_id", "amount"}
//   orders_by_customer  key customer id, the same values
//   customer_updates    key customer id, value {"customer_id", "amount"} (a table's updates)
//   customers           key customer id, value {"customer_id", "name"}

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Produced;

final class BenchTopologies {
    private BenchTopologies() { }

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Serde<String> S = Serdes.String();

    static JsonNode json(final String v) {
        try {
            return JSON.readTree(v);
        } catch (final IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static String joined(final String left, final String right) {
        return "{\"customer\":" + right + ",\"order\":" + left + "}";
    }

    static Topology build(final String workload, final JsonNode params, final Properties props) {
        final String in = params.path("prefix").asText("");
        final String out = params.get("out").asText();
        final StreamsBuilder b = new StreamsBuilder();
        final Consumed<String, String> ss = Consumed.with(S, S);
        switch (workload) {
            case "stream_filter":
                b.stream(in + "orders", ss).filter((k, v) -> json(v).get("amount").asDouble() > 500)
                    .to(out, Produced.with(S, S));
                break;
            case "table_filter":
                b.table(in + "customer_updates", ss).filter((k, v) -> json(v).get("amount").asDouble() > 500)
                    .toStream().to(out, Produced.with(S, S));
                break;
            case "count":
                b.stream(in + "orders_by_customer", ss).groupByKey().count()
                    .toStream().to(out, Produced.with(S, Serdes.Long()));
                break;
            case "count_repartition":
                b.stream(in + "orders", ss).groupBy((k, v) -> json(v).get("customer_id").asText(), Grouped.with(S, S))
                    .count().toStream().to(out, Produced.with(S, Serdes.Long()));
                break;
            case "stream_table_join": {
                final KTable<String, String> customers = b.table(in + "customers", ss);
                b.stream(in + "orders_by_customer", ss).join(customers, BenchTopologies::joined)
                    .to(out, Produced.with(S, S));
                break;
            }
            case "fk_join": {
                final KTable<String, String> customers = b.table(in + "customers", ss);
                b.table(in + "orders", ss)
                    .join(customers, v -> json(v).get("customer_id").asText(), BenchTopologies::joined)
                    .toStream().to(out, Produced.with(S, S));
                break;
            }
            default:
                throw new IllegalArgumentException("no workload named " + workload);
        }
        return b.build(props);
    }
}
