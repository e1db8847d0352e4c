"""Record collectors for tests that run a ``Task`` directly: what it sends, kept in lists."""


class RecordLog:
    """Every record sent, in order, as (topic, key, value, timestamp)."""

    def __init__(self):
        self.records = []

    def send(self, topic, key, value, ts, headers, partition=None):
        self.records.append((topic, key, value, ts))

    def flush(self):
        pass


class TopicLog:
    """Topics as append-only lists of (key, value, timestamp, headers)."""

    def __init__(self):
        self.topics = {}

    def send(self, topic, key, value, ts, headers, partition=None):
        self.topics.setdefault(topic, []).append((key, value, ts, headers))

    def flush(self):
        pass
