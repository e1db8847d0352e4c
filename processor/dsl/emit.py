"""Emission policies of aggregations: named values, passed as ``emit=`` (default ``Emit.on_change()``).

- ``Emit.on_update()``: forward every update as ``Change(new, last_emitted)``, even one that
  changes nothing (the explicit opt-out of the no-op rule).
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

from dataclasses import dataclass, replace

MODES = ("on_update", "on_change", "every", "on_window_close")
CLOCKS = ("stream", "wall")


class _factory_or_modifier:
    """``Emit.on_change()`` builds a policy; ``Emit.every(n).on_change()`` adds no-op suppression."""

    def __init__(self, build, modify):
        self.build = build
        self.modify = modify

    def __get__(self, obj, cls):
        if obj is None:
            return self.build
        return lambda: self.modify(obj)


@dataclass(frozen=True)
class Emit:
    mode: str = "on_change"
    interval_ms: int | None = None
    clock: str = "stream"
    explicit_on_change: bool = False   # ``.on_change()`` was chained (documentation only)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown emission mode {self.mode!r} (one of {MODES})")
        if self.clock not in CLOCKS:
            raise ValueError(f"Emit.every clock must be 'stream' or 'wall', not {self.clock!r}")

    @staticmethod
    def on_update() -> Emit:
        return Emit("on_update")

    @staticmethod
    def every(interval_ms: int, clock: str = "stream") -> Emit:
        if not isinstance(interval_ms, int) or interval_ms <= 0:
            raise ValueError(f"Emit.every needs a positive integer interval in ms, not {interval_ms!r}")
        if clock not in CLOCKS:
            raise ValueError(f"Emit.every clock must be 'stream' or 'wall', not {clock!r}")
        return Emit("every", interval_ms, clock)

    @staticmethod
    def on_window_close() -> Emit:
        return Emit("on_window_close")

    on_change = _factory_or_modifier(
        lambda: Emit("on_change"),
        lambda self: self if self.mode == "on_change" else (
            replace(self, explicit_on_change=True) if self.mode in ("every", "on_window_close")
            else _raise(ValueError("Emit.on_update().on_change() contradicts itself; use Emit.on_change()"))),
    )

    def __repr__(self):
        if self.mode == "every":
            clock = "" if self.clock == "stream" else f", clock={self.clock!r}"
            tail = ".on_change()" if self.explicit_on_change else ""
            return f"Emit.every({self.interval_ms}{clock}){tail}"
        return f"Emit.{self.mode}()"


def _raise(exc):
    raise exc
