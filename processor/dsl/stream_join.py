"""Stream-stream windowed joins (placeholder: being built)."""

from processor.errors import TopologyError


def stream_stream_join(left, right, joiner, windows, how, name, value_serde):
    raise TopologyError("stream-stream joins are not built yet")
