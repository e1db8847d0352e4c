"""The backlog topology of ``test_time_ordered_backlog.py`` for worker processes (`processor run`):
its topic names from ``TOB_TOPICS`` (JSON)."""

import json
import os

from tests.integration.test_time_ordered_backlog import topology_for


def backlog_topology():
    return topology_for(json.loads(os.environ["TOB_TOPICS"]))
