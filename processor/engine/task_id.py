"""A task's identity: partition ``p`` of sub-topology ``s`` (Kafka Streams' ``TaskId``).

One rule in one place for its two spellings:

- text ``"<s>_<p>"``: log lines, metrics labels, query answers, the task-owner marker, the
  membership's codecs, a task's ``id``;
- directory ``task-<s>_<p>``: its database under the application's state directory (the worker,
  its standbys, the backfill's hand-off: ``processor/state/state_directory.py``).

``TaskId`` is a named tuple, so it equals (and hashes as) the plain ``(sub, partition)`` pair the
runtime uses as a key.
"""

from __future__ import annotations

from typing import NamedTuple

DIR_PREFIX = "task-"
DIR_GLOB = "task-*_*"


class TaskId(NamedTuple):
    """Partition ``partition`` of sub-topology ``subtopology``."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @property
    def dirname(self) -> str:
        """Its directory's name under a state directory: ``task-<sub>_<partition>``."""
        return f"{DIR_PREFIX}{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """``"<sub>_<partition>"`` back to a TaskId (``ValueError`` naming the text otherwise)."""
        sub, sep, part = text.partition("_")
        if not sep or not sub.isdigit() or not part.isdigit():
            raise ValueError(f"not a task id (<sub-topology>_<partition>): {text!r}")
        return cls(int(sub), int(part))

    @classmethod
    def of_dirname(cls, name: str) -> TaskId | None:
        """The task of a directory named ``task-<sub>_<partition>``; None for any other name."""
        if not name.startswith(DIR_PREFIX):
            return None
        try:
            return cls.parse(name[len(DIR_PREFIX):])
        except ValueError:
            return None

