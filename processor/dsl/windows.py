"""Window specifications (public API names; used by windowed aggregations and stream joins)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TimeWindows:
    size_ms: int
    advance_ms: int
    grace_ms: int = 0

    @staticmethod
    def of(size_ms: int) -> TimeWindows:
        if size_ms <= 0:
            raise ValueError("window size must be positive")
        return TimeWindows(size_ms, size_ms)

    def advance_by(self, advance_ms: int) -> TimeWindows:
        if not 0 < advance_ms <= self.size_ms:
            raise ValueError("advance must be in (0, size]")
        return replace(self, advance_ms=advance_ms)

    def grace(self, grace_ms: int) -> TimeWindows:
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class JoinWindows:
    before_ms: int
    after_ms: int
    grace_ms: int = 0

    @staticmethod
    def of(time_difference_ms: int) -> JoinWindows:
        if time_difference_ms < 0:
            raise ValueError("join window must be >= 0")
        return JoinWindows(time_difference_ms, time_difference_ms)

    def grace(self, grace_ms: int) -> JoinWindows:
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class SessionWindows:
    """Sessions of one key separated by at least ``gap_ms`` of inactivity (Kafka Streams'
    ``SessionWindows.ofInactivityGapAndGrace``); ``grace_ms``: how long after a session's close
    (end + gap) a record may still join it.
    """

    gap_ms: int
    grace_ms: int = 0

    @staticmethod
    def with_inactivity_gap(gap_ms: int) -> SessionWindows:
        if gap_ms <= 0:
            raise ValueError("the inactivity gap must be positive")
        return SessionWindows(gap_ms)

    def grace(self, grace_ms: int) -> SessionWindows:
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class SlidingWindows:
    """KIP-450 sliding windows: ``[start, start + diff_ms]`` (both ends inclusive), one per
    distinct set of a key's records that fit in ``diff_ms``; ``grace_ms``: how long after a
    window's end a record may still join it.
    """

    diff_ms: int
    grace_ms: int

    @staticmethod
    def of_time_difference_and_grace(diff_ms: int, grace_ms: int) -> SlidingWindows:
        if not isinstance(diff_ms, int) or diff_ms < 0:   # (0: a window per distinct record time)
            raise ValueError("the time difference must be >= 0")
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return SlidingWindows(diff_ms, grace_ms)

    @staticmethod
    def of_time_difference_without_grace(diff_ms: int) -> SlidingWindows:
        return SlidingWindows.of_time_difference_and_grace(diff_ms, 0)
