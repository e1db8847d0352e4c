"""Stateless record-at-a-time stream operators: map, select_key, flat_map, flat_map_values, peek
and foreach (Kafka Streams' ``KStreamMap``, ``KStreamFlatMap``, ``KStreamFlatMapValues``,
``KStreamPeek``).

Invariant: each input record yields exactly the records its function says, in the order the
function gives them, with the input's timestamp (and headers, through the context); a function
that raises, or returns what is not the promised shape (a ``(key, value)`` pair, an iterable),
forwards nothing for that record and raises a ``UserFunctionError`` naming the step and the
function, which the task's on-error policy handles (dead-letter, skip or fail). For
``flat_map``/``flat_map_values`` the whole result is checked before the first record goes on,
so a bad element never leaves half of a record's outputs behind.
"""

from __future__ import annotations

from processor.errors import UserFunctionError
from processor.operators import replay as replay_semantics
from processor.operators.base import MapperOperator, Processor, describe_function


def _not_a(what: str, fn, got, step: str) -> UserFunctionError:
    shown = repr(got)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    name = describe_function(fn)
    return UserFunctionError(f"user function {name} returned {shown}, not {what}", step=step, function=name)


def _pair(fn, got, step: str) -> tuple:
    if type(got) is tuple and len(got) == 2:
        return got
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return tuple(got)
    raise _not_a("a (key, value) pair", fn, got, step)


def _items(node, fn, out, what: str) -> list:
    """The elements of what ``fn`` returned, which must be an iterable (not a str, bytes or
    dict); a failure while iterating it is the function's."""
    if out is None or isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__"):
        raise _not_a(what, fn, out, node.name)
    try:
        return list(out)
    except Exception as exc:
        raise node.user_error(fn, exc) from exc


class StreamMap(MapperOperator):
    """``mapper(key, value) -> (key2, value2)``."""

    kind = "map"
    replay = replay_semantics.STATELESS

    def process(self, key, value, timestamp):
        try:
            out = self.mapper(key, value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        k, v = _pair(self.mapper, out, self.name)
        self.forward(k, v, timestamp)


class StreamSelectKey(MapperOperator):
    """``mapper(key, value) -> key2``; the value is forwarded as it came."""

    kind = "select-key"
    replay = replay_semantics.STATELESS

    def process(self, key, value, timestamp):
        try:
            k = self.mapper(key, value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        self.forward(k, value, timestamp)


class StreamFlatMap(MapperOperator):
    """``mapper(key, value)`` -> an iterable of ``(key2, value2)``."""

    kind = "flat-map"
    replay = replay_semantics.STATELESS

    def process(self, key, value, timestamp):
        try:
            out = self.mapper(key, value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        items = _items(self, self.mapper, out, "an iterable of (key, value) pairs")
        pairs = [_pair(self.mapper, x, self.name) for x in items]
        for k, v in pairs:
            self.forward(k, v, timestamp)


class StreamFlatMapValues(MapperOperator):
    """``mapper(value)`` -> an iterable of values, each forwarded with the input's key."""

    kind = "flat-map-values"
    replay = replay_semantics.STATELESS

    def process(self, key, value, timestamp):
        try:
            out = self.mapper(value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        for v in _items(self, self.mapper, out, "an iterable of values"):
            self.forward(key, v, timestamp)


class StreamPeek(Processor):
    """``action(key, value)`` for each record, which then goes on unchanged (``foreach``: a
    peek with no child)."""

    kind = "peek"
    replay = replay_semantics.STATELESS

    def __init__(self, name, action):
        super().__init__(name)
        self.action = action

    def process(self, key, value, timestamp):
        try:
            self.action(key, value)
        except Exception as exc:
            raise self.user_error(self.action, exc) from exc
        self.forward(key, value, timestamp)


class StreamBranch(Processor):
    """``split()``: each record goes to the child of the first predicate that holds (children in
    branch order), or to the default branch's child (the last one) when ``has_default``, or
    nowhere (counted in ``unbranched``)."""

    kind = "branch"
    replay = replay_semantics.STATELESS

    def __init__(self, name, predicates, has_default: bool):
        super().__init__(name)
        self.predicates = list(predicates)
        self.has_default = has_default
        self.unbranched = 0

    def process(self, key, value, timestamp):
        for i, p in enumerate(self.predicates):
            try:
                chosen = p(key, value)
            except Exception as exc:
                raise self.user_error(p, exc) from exc
            if chosen:
                self.children[i].process(key, value, timestamp)
                return
        if self.has_default:
            self.children[len(self.predicates)].process(key, value, timestamp)
        else:
            self.unbranched += 1

    def metrics(self):
        return {"unbranched": self.unbranched}
