"""A Kafka-native stream processor: Kafka Streams-style operators, RocksDB state, Spark backfill."""

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
from processor.papi import Processor, Stores
from processor.records import Change, OutputRecord, Record, Windowed
from processor.topology import Topology

__all__ = ["StreamsBuilder", "KStream", "KTable", "Emit", "TimeWindows", "JoinWindows",
           "Change", "Record", "OutputRecord", "Windowed", "Topology", "Processor", "Stores", "SessionWindows",
           "SlidingWindows"]
__version__ = "0.1.0"
