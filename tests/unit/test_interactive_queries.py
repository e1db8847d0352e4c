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
