"""A Kafka-native stream processor: Kafka Streams-style operators, RocksDB state, Spark backfill.

The public API: ``StreamsBuilder`` and what it builds (``KStream``, ``KTable``, windows,
``Emit``), the Processor API (``Processor``, ``Stores``), the records (``Record``, ``Change``,
``Windowed``, ``OutputRecord``), the serdes (``processor.serde.Serdes``), the test driver
(``processor.testing.TopologyTestDriver``), the settings (``StreamsConfig``) and the types of
user functions (``Predicate``, ``ValueMapper``... of ``processor.functions``).

Example:
    >>> from processor import StreamsBuilder
    >>> from processor.testing import TopologyTestDriver
    >>> builder = StreamsBuilder()
    >>> builder.stream("words").map_values(str.upper).to("shouted")
    >>> with TopologyTestDriver(builder.build()) as driver:
    ...     driver.pipe_input("words", "k", "hello", timestamp=1)
    ...     [(r.key, r.value) for r in driver.read_output("shouted")]
    [('k', 'HELLO')]
"""

# first: the compiled per-record path, unless stale or PROCESSOR_PURE_PYTHON=1 (docs/compiled.md)
from processor import _compiled

_compiled.install()

from processor.config import StreamsConfig  # noqa: E402
from processor.dsl import (
                           Emit,
                           JoinWindows,
                           KStream,
                           KTable,
                           SessionWindows,
                           SlidingWindows,
                           StreamsBuilder,
                           TimeWindows,
)
from processor.functions import (
    Aggregator,
    FlatValueMapper,
    ForeachAction,
    ForeignKeyExtractor,
    Initializer,
    KeySelector,
    KeyValueMapper,
    Merger,
    Predicate,
    ProcessorSupplier,
    Punctuator,
    Reducer,
    TimestampExtractor,
    TopicNameExtractor,
    ValueJoiner,
    ValueMapper,
)
from processor.papi import Processor, Stores
from processor.records import Change, OutputRecord, Record, Windowed
from processor.topology import Topology

__all__ = ["StreamsBuilder", "KStream", "KTable", "Emit", "TimeWindows", "JoinWindows",
           "Change", "Record", "OutputRecord", "Windowed", "Topology", "Processor", "Stores", "SessionWindows",
           "SlidingWindows", "StreamsConfig",
           # the types of user functions (processor/functions.py)
           "Predicate", "ValueMapper", "FlatValueMapper", "KeyValueMapper", "KeySelector", "ValueJoiner",
           "ForeignKeyExtractor", "Initializer", "Aggregator", "Reducer", "Merger", "ForeachAction",
           "TopicNameExtractor", "TimestampExtractor", "ProcessorSupplier", "Punctuator"]
__version__ = "0.1.0"
