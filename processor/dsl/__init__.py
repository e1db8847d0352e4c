"""The DSL: StreamsBuilder, KStream, KTable, windows and emission policies."""

from processor.dsl.builder import StreamsBuilder
from processor.dsl.emit import Emit
from processor.dsl.grouped import (
                                   KGroupedStream,
                                   KGroupedTable,
                                   SessionWindowedKStream,
                                   SlidingWindowedKStream,
                                   TimeWindowedKStream,
)
from processor.dsl.kstream import KStream
from processor.dsl.ktable import KTable
from processor.dsl.windows import JoinWindows, SessionWindows, SlidingWindows, TimeWindows

__all__ = ["StreamsBuilder", "KStream", "KTable", "KGroupedStream", "KGroupedTable", "TimeWindowedKStream",
           "Emit", "TimeWindows", "JoinWindows", "SessionWindows",
           "SessionWindowedKStream", "SlidingWindows", "SlidingWindowedKStream"]
