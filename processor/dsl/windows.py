"""Window specifications (public API names; used by windowed aggregations and stream joins)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TimeWindows:
    """Fixed-size windows: tumbling, or hopping with ``advance_by`` (Kafka Streams: ``TimeWindows``).

    A window is ``[start, start + size_ms)``, its starts multiples of ``advance_ms``; a record
    is in every window that contains its timestamp. ``grace_ms``: how long after a window's end
    a record may still join it.

    Attributes:
        size_ms: The windows' size.
        advance_ms: The distance between two windows' starts (``size_ms``: tumbling).
        grace_ms: The grace period.

    Example:
        >>> from processor import TimeWindows
        >>> TimeWindows.of(60_000).advance_by(10_000).grace(5_000)
        TimeWindows(size_ms=60000, advance_ms=10000, grace_ms=5000)
    """
    size_ms: int
    advance_ms: int
    grace_ms: int = 0

    @staticmethod
    def of(size_ms: int) -> TimeWindows:
        """Tumbling windows of ``size_ms`` (Kafka Streams: ``TimeWindows.ofSizeWithNoGrace``).

        Args:
            size_ms: The windows' size, positive.

        Returns:
            The windows, without grace.

        Raises:
            ValueError: The size is not positive.
        """
        if size_ms <= 0:
            raise ValueError("window size must be positive")
        return TimeWindows(size_ms, size_ms)

    def advance_by(self, advance_ms: int) -> TimeWindows:
        """These windows, hopping by ``advance_ms`` (Kafka Streams: ``TimeWindows#advanceBy``).

        Args:
            advance_ms: The distance between two windows' starts, in ``(0, size]``.

        Returns:
            The hopping windows.

        Raises:
            ValueError: The advance is out of range.
        """
        if not 0 < advance_ms <= self.size_ms:
            raise ValueError("advance must be in (0, size]")
        return replace(self, advance_ms=advance_ms)

    def grace(self, grace_ms: int) -> TimeWindows:
        """These windows with a grace period (Kafka Streams: ``TimeWindows.ofSizeAndGrace``).

        Args:
            grace_ms: How long after a window's end a record may still join it, ``>= 0``.

        Returns:
            The windows.

        Raises:
            ValueError: The grace is negative.
        """
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class JoinWindows:
    """How far apart two records' timestamps may be to join, in a stream-stream join (``JoinWindows``).

    A left record at ``t`` joins the right records in ``[t - before_ms, t + after_ms]``.

    Attributes:
        before_ms: How much earlier a right record may be.
        after_ms: How much later a right record may be.
        grace_ms: How long after a window's end a record may still join.
    """
    before_ms: int
    after_ms: int
    grace_ms: int = 0

    @staticmethod
    def of(time_difference_ms: int) -> JoinWindows:
        """Records at most ``time_difference_ms`` apart (Kafka Streams: ``JoinWindows.ofTimeDifferenceWithNoGrace``).

        Args:
            time_difference_ms: The largest difference, ``>= 0``, before and after.

        Returns:
            The join windows, without grace.

        Raises:
            ValueError: The difference is negative.
        """
        if time_difference_ms < 0:
            raise ValueError("join window must be >= 0")
        return JoinWindows(time_difference_ms, time_difference_ms)

    def grace(self, grace_ms: int) -> JoinWindows:
        """These join windows with a grace period (Kafka Streams: ``JoinWindows.ofTimeDifferenceAndGrace``).

        Args:
            grace_ms: How long after a window's end a record may still join, ``>= 0``.

        Returns:
            The join windows.

        Raises:
            ValueError: The grace is negative.
        """
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class SessionWindows:
    """Sessions of one key separated by at least ``gap_ms`` of inactivity (Kafka Streams: ``SessionWindows``).

    Attributes:
        gap_ms: The inactivity gap that closes a session.
        grace_ms: How long after a session's close (end + gap) a record may still join it.
    """

    gap_ms: int
    grace_ms: int = 0

    @staticmethod
    def with_inactivity_gap(gap_ms: int) -> SessionWindows:
        """Sessions closed by ``gap_ms`` of inactivity (Kafka Streams: ``SessionWindows.ofInactivityGapWithNoGrace``).

        Args:
            gap_ms: The gap, positive.

        Returns:
            The session windows, without grace.

        Raises:
            ValueError: The gap is not positive.
        """
        if gap_ms <= 0:
            raise ValueError("the inactivity gap must be positive")
        return SessionWindows(gap_ms)

    def grace(self, grace_ms: int) -> SessionWindows:
        """These session windows with a grace period (``SessionWindows.ofInactivityGapAndGrace``).

        Args:
            grace_ms: How long after a session's close a record may still join it, ``>= 0``.

        Returns:
            The session windows.

        Raises:
            ValueError: The grace is negative.
        """
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return replace(self, grace_ms=grace_ms)


@dataclass(frozen=True)
class SlidingWindows:
    """KIP-450 sliding windows (Kafka Streams: ``SlidingWindows``).

    Windows ``[start, start + diff_ms]`` (both ends inclusive), one per distinct set of a key's
    records that fit in ``diff_ms``.

    Attributes:
        diff_ms: The largest time difference between two records of a window.
        grace_ms: How long after a window's end a record may still join it.
    """

    diff_ms: int
    grace_ms: int

    @staticmethod
    def of_time_difference_and_grace(diff_ms: int, grace_ms: int) -> SlidingWindows:
        """Sliding windows of ``diff_ms`` with a grace period (``SlidingWindows.ofTimeDifferenceAndGrace``).

        Args:
            diff_ms: The time difference, ``>= 0`` (0: a window per distinct record time).
            grace_ms: The grace period, ``>= 0``.

        Returns:
            The sliding windows.

        Raises:
            ValueError: Either is negative.
        """
        if not isinstance(diff_ms, int) or diff_ms < 0:   # (0: a window per distinct record time)
            raise ValueError("the time difference must be >= 0")
        if grace_ms < 0:
            raise ValueError("grace must be >= 0")
        return SlidingWindows(diff_ms, grace_ms)

    @staticmethod
    def of_time_difference_without_grace(diff_ms: int) -> SlidingWindows:
        """Sliding windows of ``diff_ms`` without grace (``SlidingWindows.ofTimeDifferenceWithNoGrace``).

        Args:
            diff_ms: The time difference, ``>= 0``.

        Returns:
            The sliding windows.
        """
        return SlidingWindows.of_time_difference_and_grace(diff_ms, 0)
