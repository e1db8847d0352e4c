"""The host-neutral engine: what every host (worker, test driver, Spark backfill) shares.

Nothing in this package imports confluent_kafka or rocksdict: hosts pass their own stores,
collectors and clocks in.
"""
