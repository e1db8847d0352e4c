"""A processing retry starts the attempt's figures over (``BackfillReport.start_over``) and keeps
what came before processing (the snapshot, the global tables, the stages' seconds) and the
executors' builds of every task run."""

from backfill.job import BackfillReport


def test_start_over_resets_the_attempt_and_keeps_the_rest():
    r = BackfillReport("app", {("t", 0): (0, 9)}, global_records=4, seconds={"snapshot": 1.5})
    r.rows_read, r.rows_replayed, r.records_processed = 9, 7, 12
    r.rows_per_store["s"] = 3
    r.finalized.add(1)
    r.failed_in_processing["t"] = 2
    r.unordered.append("t[0]")
    r.fk_records_superseded = 5
    r.executor_builds["compiled"] = 2
    r.start_over()
    fresh = BackfillReport("app", {("t", 0): (0, 9)})
    assert [getattr(r, f) for f in BackfillReport.ATTEMPT_FIELDS] == \
        [getattr(fresh, f) for f in BackfillReport.ATTEMPT_FIELDS]
    assert (r.snapshot, r.global_records, r.seconds, r.executor_builds) == \
        ({("t", 0): (0, 9)}, 4, {"snapshot": 1.5}, {"compiled": 2})
