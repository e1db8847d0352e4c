"""Emission policies of aggregations: named values, passed as ``emit=`` (default ``Emit.on_change()``).

- ``Emit.on_update()``: forward every update as ``Change(new, last_emitted)``, even one that
  changes nothing (the explicit opt-out of the no-op rule); as in Kafka Streams, such an update
  also advances the stored timestamp, so the next one is stamped at least as late.
- ``Emit.on_change()``: forward only when the new value's bytes differ from the last-emitted
  bytes; a skipped update keeps the timestamp of the last real change (KIP-557).
- ``Emit.every(interval_ms, clock="stream" | "wall")``: per key at most one emission per interval
  (an update after a quiet interval goes out at once; later ones wait), the latest value wins; a
  punctuator on that clock forwards every key whose current value differs from its last-emitted
  value once its interval has passed, and pending keys are flushed on graceful shutdown and on
  partition revocation. It never emits a no-op, so ``Emit.every(n).on_change()`` (accepted, to say
  so explicitly) behaves exactly like ``Emit.every(n)``.
- ``Emit.on_window_close()``: windowed aggregations only; each window is emitted once, as
  ``Change(final, None)``, when stream time reaches window end + grace. Later records for it are
  dropped and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

MODES = ("on_update", "on_change", "every", "on_window_close")
CLOCKS = ("stream", "wall")


class _factory_or_modifier:
    """``Emit.on_change()`` builds a policy; ``Emit.every(n).on_change()`` adds no-op suppression."""

    def __init__(self, build: Callable[[], Emit], modify: Callable[[Emit], Emit]):
        self.build = build
        self.modify = modify

    def __get__(self, obj: Emit | None, cls: type) -> Callable[[], Emit]:
        if obj is None:
            return self.build
        return lambda: self.modify(obj)


@dataclass(frozen=True)
class Emit:
    """When an aggregation forwards its updates: an emission policy (Kafka Streams: ``EmitStrategy``, KIP-825).

    Passed as ``emit=`` to ``count``, ``reduce`` and ``aggregate`` (default
    ``Emit.on_change()``); the policies are described in this module's docstring.

    Attributes:
        mode: ``"on_update"``, ``"on_change"``, ``"every"`` or ``"on_window_close"``.
        interval_ms: ``every``'s interval, in ms.
        clock: ``every``'s clock: ``"stream"`` (stream time) or ``"wall"`` (wall-clock time).
        explicit_on_change: ``.on_change()`` was chained (documentation only).

    Example:
        >>> from processor import Emit, StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> Emit.every(1000).on_change()
        Emit.every(1000).on_change()
        >>> builder = StreamsBuilder()
        >>> highest = builder.stream("readings").group_by_key().reduce(max, emit=Emit.on_change())
        >>> highest.to_stream().to("highest")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for reading in [3, 5, 4, 5, 6]:
        ...         driver.pipe_input("readings", "sensor-1", reading, timestamp=1)
        ...     [r.value for r in driver.read_output("highest")]
        [3, 5, 6]
    """
    mode: str = "on_change"
    interval_ms: int | None = None
    clock: str = "stream"
    explicit_on_change: bool = False   # ``.on_change()`` was chained (documentation only)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown emission mode {self.mode!r} (one of {MODES})")
        if self.clock not in CLOCKS:
            raise ValueError(f"Emit.every clock must be 'stream' or 'wall', not {self.clock!r}")

    @staticmethod
    def on_update() -> Emit:
        """Forwards every update, even one that changes nothing (Kafka Streams: ``EmitStrategy.onWindowUpdate``).

        Returns:
            The policy.
        """
        return Emit("on_update")

    @staticmethod
    def every(interval_ms: int, clock: str = "stream") -> Emit:
        """Per key at most one emission per interval, the latest value winning (a rate limit).

        The nearest in Kafka Streams is ``suppress(untilTimeLimit(...))``, which holds a key's
        first update for the interval too (docs/reference.md, D12). Here an update after a quiet
        interval goes out at once, later ones wait; pending keys are flushed on shutdown and on
        revocation.

        Args:
            interval_ms: The interval, a positive number of ms.
            clock: ``"stream"`` (stream time) or ``"wall"`` (wall-clock time).

        Returns:
            The policy.

        Raises:
            ValueError: The interval is not positive, or the clock is neither.
        """
        if not isinstance(interval_ms, int) or interval_ms <= 0:
            raise ValueError(f"Emit.every needs a positive integer interval in ms, not {interval_ms!r}")
        if clock not in CLOCKS:
            raise ValueError(f"Emit.every clock must be 'stream' or 'wall', not {clock!r}")
        return Emit("every", interval_ms, clock)

    @staticmethod
    def on_window_close() -> Emit:
        """Each window once, final, when stream time passes its end + grace (``EmitStrategy.onWindowClose``).

        Windowed aggregations only; later records for a closed window are dropped and counted.

        Returns:
            The policy.
        """
        return Emit("on_window_close")

    on_change = _factory_or_modifier(
        lambda: Emit("on_change"),
        lambda self: self if self.mode == "on_change" else (
            replace(self, explicit_on_change=True) if self.mode in ("every", "on_window_close")
            else _raise(ValueError("Emit.on_update().on_change() contradicts itself; use Emit.on_change()"))),
    )

    def __repr__(self) -> str:
        if self.mode == "every":
            clock = "" if self.clock == "stream" else f", clock={self.clock!r}"
            tail = ".on_change()" if self.explicit_on_change else ""
            return f"Emit.every({self.interval_ms}{clock}){tail}"
        return f"Emit.{self.mode}()"


def _raise(exc: Exception) -> NoReturn:
    raise exc
