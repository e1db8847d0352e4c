"""Emission policies (named values, not flags). Wired into aggregations by the aggregation work;
defined here because ``from processor import Emit`` is part of the public API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Emit:
    mode: str = "on_change"          # on_update | on_change | every | on_window_close
    interval_ms: int | None = None
    clock: str = "stream"
    suppress_noops: bool = True

    @staticmethod
    def on_update() -> "Emit":
        return Emit("on_update", suppress_noops=False)

    @staticmethod
    def on_change() -> "Emit":
        return Emit("on_change")

    @staticmethod
    def every(interval_ms: int, clock: str = "stream") -> "Emit":
        if interval_ms <= 0:
            raise ValueError("Emit.every needs a positive interval")
        if clock not in ("stream", "wall"):
            raise ValueError("Emit.every clock must be 'stream' or 'wall'")
        return Emit("every", interval_ms, clock, suppress_noops=False)

    @staticmethod
    def on_window_close() -> "Emit":
        return Emit("on_window_close")
