"""The Kafka pieces both hosts use, the worker (``processor.runtime``) and the backfill
(``backfill``): client settings and their layering (``client_config``), the client factory and
the admin, produce and partition helpers (``clients``), internal topics created and checked as
Kafka Streams does (``internal_topics``), which partitioner placed a user topic's keys
(``partitioning``), and where partitions end, from fetches (``partition_ends``).

Invariant: nothing here keeps state of a task or runs an operator; these modules talk to Kafka
and translate its errors (``processor.errors``) with the topic, partition and step named.
"""
