"""Every operator declares what it is to a reduced replay (``processor/operators/replay.py``):
one of the declared values, ``HISTORY`` unless it says otherwise; the backfill's compaction
reads only that."""

import importlib
import inspect
import pkgutil

import processor.operators
from processor.operators import replay
from processor.operators.base import Processor

VALUES = {v for k, v in vars(replay).items() if k.isupper()}


def _operators():
    for m in pkgutil.iter_modules(processor.operators.__path__):
        mod = importlib.import_module(f"processor.operators.{m.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, Processor) and cls.__module__ == mod.__name__:
                yield cls


def test_every_operator_declares_one_of_the_values():
    ops = list(_operators())
    assert len(ops) > 30
    assert sorted({c.__name__ for c in ops if c.replay not in VALUES}) == []
    declared = {c.__name__: c.replay for c in ops if c.replay != replay.HISTORY}
    assert declared["TableSource"] == replay.TABLE_SOURCE and declared["TableMapValues"] == replay.TABLE_MAP
    assert "StreamSource" not in declared and "StreamAggregate" not in declared
