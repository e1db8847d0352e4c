"""What each operator is to a replay reduced to every key's last changes (the backfill's
compaction, ``backfill/compaction.py``): a class attribute ``replay`` of every operator, so the
backfill decides from what operators declare, not from a chain of type checks.

- ``HISTORY`` (the default, ``Processor.replay``): its state or its outputs depend on every change
  it receives (an aggregation, a window, a stream join, a table join's lookups).
- ``TABLE_SOURCE``: a table read from a topic (what compaction may reduce).
- ``TABLE_STEP``: a table filter: it passes or drops the source's own changes.
- ``TABLE_MAP``: a table map_values: its changes are no longer the source's (it skips results
  equal to the one before).
- ``TO_STREAM``: a table's changes become a stream's events.
- ``STATELESS``: a stateless stream step (filter, map, select_key, flat_map, peek, branch).
- ``PASS_THROUGH``: a named point of the graph (a table's result store, a merge): stateless.
- ``SINK``: a sink (its ``attrs.internal`` says whether to an internal topic).
- ``FK_SUBSCRIPTION_SENDER``, ``FK_SUBSCRIPTION_RECEIVER``, ``FK_RESPONDER``,
  ``FK_RESPONSE_RESOLVER``: the four parts of a foreign-key join (left side: the sender and the
  resolver; right side: the receiver and the responder).
- ``USER_PROCESSOR``: a user processor: it punctuates on its task's stream time, which every
  input record moves.
"""

HISTORY = "history"
TABLE_SOURCE = "table-source"
TABLE_STEP = "table-step"
TABLE_MAP = "table-map"
TO_STREAM = "to-stream"
STATELESS = "stateless"
PASS_THROUGH = "pass-through"
SINK = "sink"
FK_SUBSCRIPTION_SENDER = "fk-subscription-sender"
FK_SUBSCRIPTION_RECEIVER = "fk-subscription-receiver"
FK_RESPONDER = "fk-responder"
FK_RESPONSE_RESOLVER = "fk-response-resolver"
USER_PROCESSOR = "user-processor"
