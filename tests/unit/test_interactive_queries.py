"""StoreQueries: the hand-over of a query from any thread to the main loop
(``processor/runtime/interactive_queries.py``). The store reads themselves are tested on the
broker (``tests/integration/test_http_endpoint.py``)."""

import threading
import time

import pytest

from processor.runtime.interactive_queries import StoreNotReady, StoreQueries


def test_a_query_from_another_thread_runs_on_the_loop_thread():
    q = StoreQueries(worker=None)
    q.loop_thread = threading.current_thread()
    ran_on, results = [], []
    t = threading.Thread(target=lambda: results.append(q.call(lambda: ran_on.append(threading.current_thread()) or 42)))
    t.start()
    deadline = time.monotonic() + 5
    while not q.pending():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    q.serve()
    t.join(5)
    assert results == [42]
    assert ran_on == [threading.current_thread()]


def test_errors_reach_the_caller_and_a_loop_that_does_not_answer_times_out():
    q = StoreQueries(worker=None)
    q.loop_thread = threading.current_thread()
    errors = []

    def ask(fn, timeout_s):
        try:
            q.call(fn, timeout_s)
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=ask, args=(lambda: 1 / 0, 5))
    t.start()
    while not q.pending():
        time.sleep(0.01)
    q.serve()
    t.join(5)
    assert [type(e) for e in errors] == [ZeroDivisionError]
    t = threading.Thread(target=ask, args=(lambda: 1, 0.2))
    t.start()
    t.join(5)
    assert isinstance(errors[-1], StoreNotReady) and "did not answer" in str(errors[-1])
    q.serve()        # the abandoned query is dropped, not run
    assert not q.pending()


def test_a_worker_not_running_answers_not_ready():
    q = StoreQueries(worker=None)
    with pytest.raises(StoreNotReady, match="not running"):
        q.call(lambda: 1)


def _asked(q, fn, steps=False, timeout_s=5.0):
    """``fn`` asked of ``q`` from another thread, once it waits: ``(thread, results)``."""
    results: list = []

    def ask():
        try:
            results.append(q.call_steps(fn, timeout_s) if steps else q.call(fn, timeout_s))
        except Exception as exc:
            results.append(exc)

    before = q._queue.qsize()
    t = threading.Thread(target=ask)
    t.start()
    deadline = time.monotonic() + 5
    while q._queue.qsize() == before:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return t, results


def test_a_scan_is_answered_in_slices_and_queries_asked_meanwhile_go_between_them():
    q = StoreQueries(worker=None)
    q.loop_thread = threading.current_thread()
    done = []

    def scan():
        for i in range(4):
            done.append(f"slice {i}")
            yield
        return "scanned"

    scanning, scan_result = _asked(q, scan, steps=True)
    q.serve(budget_s=0)   # one slice per iteration with no time to spare
    assert done == ["slice 0"] and q.pending()
    lookup, lookup_result = _asked(q, lambda: done.append("lookup") or "found")
    while q.pending():
        q.serve(budget_s=0)
    scanning.join(5)
    lookup.join(5)
    assert (scan_result, lookup_result) == (["scanned"], ["found"])
    assert done == ["slice 0", "slice 1", "lookup", "slice 2", "slice 3"]


def test_too_many_waiting_queries_are_refused(monkeypatch):
    from processor.runtime import interactive_queries

    monkeypatch.setattr(interactive_queries, "MAX_WAITING", 2)
    q = StoreQueries(worker=None)
    q.loop_thread = threading.current_thread()
    waiting = [_asked(q, lambda i=i: i) for i in range(2)]
    refused: list = []
    t = threading.Thread(target=lambda: refused.append(pytest.raises(interactive_queries.QueryBusy, q.call, lambda: 3)))
    t.start()
    t.join(5)
    assert "2 queries already wait" in str(refused[0].value)
    q.serve()
    for t, _ in waiting:
        t.join(5)
    assert [r for _, results in waiting for r in results] == [0, 1]
