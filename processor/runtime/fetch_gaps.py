"""The fetch-gap guard of internal partitions: an offset skipped by the broker's fetch is read again.

Internal topics are written by this application's producers only, so their offsets are contiguous
except for transaction markers; when no transaction writes them (at least once) or the broker
writes no markers (exactly once read uncommitted: Tansu), an offset after a task's position means
the broker's fetch skipped records (seen on Tansu while another producer's batch was being
appended). Invariant kept: for each guarded partition at most one open gap ``(position, offset,
fetches, since)``; while it is open the consumer is sought back to the position, and the gap is
closed either by the records read again (``refetched``) or by accepting it (``accepted``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition

log = logging.getLogger("processor.worker")

# a gap in an internal partition that persists this long and over this many fetches is accepted
GAP_ACCEPT_S = 5.0
GAP_RETRIES = 20
# a gap of at most this many offsets (transaction markers: one per producer whose transaction
# ended between two records) is accepted when this many fetches back to it return it again
MARKER_GAP = 16
SMALL_GAP_FETCHES = 2


class FetchGaps:
    """The open gaps of the guarded internal partitions, and how many were read again or accepted."""

    consumer: Consumer   # the group consumer, set when the worker opens it

    def __init__(self, guarded: set[str] | frozenset[str]) -> None:
        # the internal topics checked (none when their readers see only committed records)
        self.guarded = guarded
        # (topic, partition) -> (position, offset, fetches, since)
        self.gaps: dict[tuple[str, int], tuple[int, int, int, float]] = {}
        self.refetched = 0
        self.accepted = 0

    def check(self, topic: str, part: int, pos: int | None, offset: int) -> bool:
        """An internal partition's record at ``offset``, the task at ``pos``: True when the caller
        must drop it (and the rest of the partition's batch) because the worker sought back to
        read a gap again. Records found in the gap when it is read again were skipped by the
        broker's fetch (logged, ``fetch_gaps_refetched``). A gap the broker keeps returning is
        accepted (``fetch_gaps_accepted``): after ``SMALL_GAP_FETCHES`` fetches when it spans at
        most ``MARKER_GAP`` offsets (transaction markers, one per producer whose transaction
        ended there), else after ``GAP_RETRIES`` fetches over ``GAP_ACCEPT_S`` (with a warning).
        The loop never sleeps here: other partitions go on meanwhile."""
        key = (topic, part)
        g = self.gaps.get(key)
        if g is not None:
            g_pos, g_off, attempts, since = g
            if pos is None or g_pos != pos or offset < g_off:
                del self.gaps[key]
                if pos is not None and g_pos == pos and offset < g_off:
                    self.refetched += 1
                    log.warning("%s[%d]: the broker's fetch had skipped offsets %d..%d (records are there when "
                                "read again); reading them", topic, part, pos, g_off - 1)
                return False if pos is None or offset <= pos else self.check(topic, part, pos, offset)
            if offset == g_off:
                now = time.monotonic()
                small = g_off - pos <= MARKER_GAP
                if (small and attempts >= SMALL_GAP_FETCHES) or \
                        (attempts >= GAP_RETRIES and now - since >= GAP_ACCEPT_S):
                    del self.gaps[key]
                    self.accepted += 1
                    if not small:
                        log.warning("%s[%d]: offsets %d..%d returned no record in %d fetches over %.1f s; going on "
                                    "at %d", topic, part, pos, g_off - 1, attempts, now - since, g_off)
                    return False
                self.gaps[key] = (pos, g_off, attempts + 1, since)
                self.consumer.seek(TopicPartition(topic, part, pos))
                return True
        if pos is None or offset <= pos:
            return False
        self.gaps[key] = (pos, offset, 1, time.monotonic())
        self.consumer.seek(TopicPartition(topic, part, pos))
        return True

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Revoked, lost or rebuilt partitions: their gap checks start over."""
        for tp in partitions:
            self.gaps.pop(tp, None)

    def clear(self) -> None:
        """Every task rebuilt (an aborted transaction): every gap check starts over."""
        self.gaps.clear()
