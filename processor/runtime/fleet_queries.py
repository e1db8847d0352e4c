"""The fleet's query policy: who answers for a key, and how a prefix scan spans the fleet.

Apart from HTTP (``processor/runtime/http_endpoint.py`` parses a request, asks this, and writes
its ``Answer``): Kafka Streams' ``StreamsMetadataState`` and the forwarding an application does
with it. Who holds a key is decided by ``StoreView.metadata`` (``interactive_queries.py``).

- **A key** (``key``): answered from this worker's task; from a standby here only with
  ``?stale=true``. A key whose task runs elsewhere is forwarded to its active worker (or, with
  ``?redirect=true``, the caller is sent there: 307); with ``?stale=true``, when the active cannot
  answer, a standby's copy is asked. A forwarded request is answered here only (never forwarded
  twice: a worker the asking worker's map named that does not run the task answers 503, the task
  is moving).
- **A prefix scan** (``prefix``): this worker's page, and every other server's (asked at once),
  merged by partition; a partition no server runs now makes the scan incomplete (503, unless
  ``?partial=true``).
- **Peers** are asked with ``ask_peer`` (this worker's credentials, ``FORWARDED`` set);
  ``PeerUnanswered`` when one cannot be reached.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from processor.runtime.http_security import NO_SECURITY, HTTPSecurity
from processor.runtime.interactive_queries import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    SCAN_TIMEOUT_S,
    Cursor,
    KeyNotHosted,
    QueryError,
    QueryHost,
    StoreNotReady,
    StoreView,
)
from processor.serde import StringSerde

FORWARDED = "X-Processor-Forwarded"   # a request one worker sends another: answered here only
FORWARD_TIMEOUT_S = 5.0               # how long a worker waits for another's answer


@dataclass
class Answer:
    """What the endpoint sends: a status, a JSON body, headers."""

    status: int
    body: dict
    headers: dict[str, str] | None = None


class PeerUnanswered(Exception):
    """Another worker of the fleet did not answer a forwarded request."""

    def __init__(self, server: str, reason: str):
        super().__init__(f"{server} did not answer: {reason}")
        self.server = server
        self.reason = reason


def ask_peer(server: str, path: str, security: HTTPSecurity = NO_SECURITY,
             timeout_s: float = FORWARD_TIMEOUT_S) -> tuple[int, dict]:
    """``(status, JSON body)`` of ``GET path`` on worker ``server`` (``host:port``), asked as a
    forwarded request with this worker's credentials (``http_security.py`` invariant 3);
    ``PeerUnanswered`` when it cannot be reached, times out or answers something that is not a
    JSON object."""
    req = urllib.request.Request(f"{security.scheme}://{server}{path}",
                                 headers={FORWARDED: "1", **security.peer_headers()})
    try:
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=security.client_context) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        body = json.loads(raw)
    except (OSError, ValueError) as exc:   # refused, timed out, reset, TLS; a body that is not JSON
        reason = getattr(exc, "reason", exc)
        raise PeerUnanswered(server, f"{type(reason).__name__}: {reason}") from None
    if not isinstance(body, dict):
        raise PeerUnanswered(server, f"a {type(body).__name__} instead of a JSON object")
    return status, body


class FleetQueries:
    """The query policy of one worker's endpoint (see the module docstring)."""

    def __init__(self, worker: QueryHost, security: HTTPSecurity = NO_SECURITY) -> None:
        self.worker = worker
        self.security = security

    def key(self, view: StoreView, key_text: str, query: dict, forwarded: bool) -> Answer:
        """The row of the key whose text is ``key_text`` (see the module docstring): from this
        worker's task or standby, else forwarded (``forwarded``: the asking worker forwarded it)."""
        key = key_of(view, key_text)
        worker = self.worker
        stale, redirect = _flag(query, "stale"), _flag(query, "redirect")
        try:
            entry, where = view.lookup(key, stale=stale)
        except KeyNotHosted as exc:
            if worker.application_server is None and not worker.fleet_map:
                raise   # not in a fleet that answers for any key: answered here only (404)
            if not worker.fleet_map:
                raise StoreNotReady(f"{exc} (this worker has no assignment from its group yet: ask again)") from None
            if forwarded:
                # the asking worker's map named this one, which does not run the task (any more, or
                # not yet): the task is moving, so ask again (never forwarded twice)
                raise StoreNotReady(f"{exc} (the task is moving between workers: ask again)") from None
            return self._forward(view, key_text, query, key, redirect, stale)
        except StoreNotReady:
            # restoring here, or a standby here that never caught up: another copy may answer
            # (a global store's tables are bootstrapping: every worker's are, or were, so here)
            if forwarded or not worker.fleet_map or view.is_global:
                raise
            return self._forward(view, key_text, query, key, redirect, stale)
        if entry is None and where.get("stale"):
            # a standby without the row is no proof the key has none: the active answers
            if forwarded:
                raise StoreNotReady(f"store {view.name!r}: the standby replica of task {where['task']} here has "
                                    f"no row for the key, which is no proof that the task has none")
            return self._forward(view, key_text, query, key, redirect, stale=True)
        if entry is None:
            return Answer(404, {"error": f"no row for key {key_text!r} in store {view.name!r}",
                                **where, "hosted_here": True})
        return Answer(200, entry)

    def _forward(self, view: StoreView, key_text: str, query_in: dict, key, redirect: bool, stale: bool) -> Answer:
        """Answer for a key whose task this worker cannot answer for: relay its active owner's
        answer (or send the caller there); with ``stale``, when the active cannot answer (down,
        restoring, the task between owners), a standby's. 503 only when no copy answers."""
        meta = view.metadata(key)
        security = self.security
        me = self.worker.application_server
        path = f"/stores/{quote(view.name, safe='')}/{quote(key_text, safe='')}"
        params = [(k, v) for k, v in query_in.items() if k not in ("stale", "redirect")]
        failures = []
        if meta.active is None:
            failures.append(f"store {view.name!r}: task {meta.task} (partition {meta.partition}) has no active "
                            f"worker in the fleet's assignment")
        elif meta.active == me:
            failures.append(f"store {view.name!r}: task {meta.task} is assigned to this worker ({me}) but not "
                            f"open here yet")
        elif redirect:
            query = urlencode([(k, v) for k, v in query_in.items() if k != "redirect"], doseq=True)
            location = f"{security.scheme}://{meta.active}{path}" + (f"?{query}" if query else "")
            return Answer(307, {"location": location, "task": meta.task}, {"Location": location})
        else:
            try:
                # (without ?stale: the active answers from its task, never from a standby it may keep)
                query = urlencode(params, doseq=True)
                status, body = ask_peer(meta.active, path + (f"?{query}" if query else ""), security)
                if status != 503 or not stale:
                    return Answer(status, {**body, "served_by": meta.active})
                failures.append(f"{meta.active} answered 503: {body.get('error', body)}")
            except PeerUnanswered as exc:
                failures.append(f"store {view.name!r}: task {meta.task} is active on {exc.server}, which did not "
                                f"answer: {exc.reason}")
        if stale:
            query = urlencode(params + [("stale", ["true"])], doseq=True)
            for server in meta.standbys:
                if server == me:
                    continue   # (this worker's own copy was asked first)
                try:
                    status, body = ask_peer(server, path + f"?{query}", security)
                except PeerUnanswered as exc:
                    failures.append(str(exc))
                    continue
                if status == 200:   # (stale from its replica; fresh if the task runs there by now)
                    return Answer(status, {**body, "served_by": server})
                failures.append(f"standby {server} answered {status}: {body.get('error', body)}")
        raise StoreNotReady("; ".join(failures))

    def prefix(self, view: StoreView, query: dict, forwarded: bool) -> Answer:
        """A page of this worker's entries, and (unless asked by another worker: ``forwarded``)
        every other server's, merged (see the module docstring)."""
        worker = self.worker
        text = query.get("limit", [str(DEFAULT_LIMIT)])[-1]
        if not text.isdigit() or int(text) < 1:
            raise QueryError(f"limit must be a whole number, 1 or more, not {text[:40]!r}")
        limit = min(int(text), MAX_LIMIT)
        prefix = query.get("prefix", [""])[-1]
        after_text = query.get("after", [""])[-1]
        after = Cursor.parse(after_text) if after_text else None
        page = view.page(prefix, limit, after)   # first: a refused scan is refused here
        fleet_map = worker.fleet_map
        if view.is_global or forwarded or not fleet_map:
            body: dict[str, Any] = {"entries": page.entries, "partitions": page.partitions}
            if page.next is not None:
                body["next"] = str(page.next)
            if forwarded:   # (the asking worker merges pages by them)
                body["cursors"] = [str(c) for c in page.cursors]
            return Answer(200, body)
        me = worker.application_server
        others = sorted(s for s in fleet_map if s != me)
        params = {"prefix": prefix, "limit": limit, **({"after": after_text} if after else {})}
        path = f"/stores/{quote(view.name, safe='')}?" + urlencode(params)
        answers: list[tuple[str | None, ScanAnswer]] = [
            (me, ScanAnswer(page.entries, page.cursors, page.partitions, page.next))]
        server: str | None
        missing: dict[str, str] = {}
        security = self.security
        with ThreadPoolExecutor(max(1, len(others))) as pool:
            for server, got in zip(others, pool.map(lambda s: _scan_of(s, path, security), others), strict=True):
                if isinstance(got, str):
                    missing[server] = got
                else:
                    answers.append((server, got))
        # a partition whose task no server runs now (restoring, or between two owners) has no
        # entries in any answer: the scan is incomplete, never silently short
        taken_from: dict[int, str | None] = {}   # partition -> the server whose entries are taken
        for server, a in answers:   # (server None: this worker, no application server)
            for p in a.partitions:
                taken_from.setdefault(p, server)
        # past the first partition where a server's page ended, its entries are on its next page
        ends = [a.next.partition for _, a in answers if a.next is not None and a.next.partition is not None]
        cut = min(ends) if ends else None
        first = after.partition if after is not None and after.partition is not None else 0
        last = view.partition_count() - 1 if cut is None else cut
        unanswered = [p for p in range(first, last + 1) if p not in taken_from]
        if (missing or unanswered) and not _flag(query, "partial"):
            why = list(missing.values())
            if unanswered:
                why.append(f"no worker runs the task of partition(s) {unanswered} now (restoring or moving)")
            raise StoreNotReady(f"store {view.name!r}: the prefix scan is incomplete: "
                                + "; ".join(why) + " (?partial=true answers without them)")
        merged = [(e, c) for server, a in answers for e, c in zip(a.entries, a.cursors, strict=True)
                  if taken_from.get(e["partition"]) == server and (cut is None or e["partition"] <= cut)]
        merged.sort(key=lambda ec: ec[0]["partition"])   # stable: each partition in its server's order
        body = {"entries": [e for e, _ in merged[:limit]]}
        if cut is not None or len(merged) > limit:
            ended = [a.next for _, a in answers if a.next is not None]
            body["next"] = str(merged[:limit][-1][1] if merged else min(ended, key=Cursor.position))
        if _flag(query, "partial"):
            body["missing"] = sorted(missing)
            body["missing_partitions"] = unanswered
        return Answer(200, body)


@dataclass
class ScanAnswer:
    """One server's page of a fleet's prefix scan (``ScanPage`` over the wire)."""

    entries: list[dict]
    cursors: list[Cursor]
    partitions: list[int]
    next: Cursor | None


def _scan_of(server: str, path: str, security: HTTPSecurity) -> ScanAnswer | str:
    """A server's own page of a prefix scan, or why there is none."""
    try:
        # (a peer answers a scan in slices between its batches, for up to its own SCAN_TIMEOUT_S)
        status, body = ask_peer(server, path, security, timeout_s=SCAN_TIMEOUT_S + FORWARD_TIMEOUT_S)
    except PeerUnanswered as exc:
        return str(exc)
    entries, cursors, parts = body.get("entries"), body.get("cursors"), body.get("partitions")
    if status != 200 or not isinstance(entries, list) or not isinstance(parts, list):
        return f"{server} answered {status}: {body.get('error', body)}"
    if not isinstance(cursors, list) or len(cursors) != len(entries):
        return f"{server} answered without the cursors of its entries (a worker of an older version)"
    try:
        return ScanAnswer(entries, [Cursor.parse(c) for c in cursors], parts,
                          Cursor.parse(body["next"]) if body.get("next") else None)
    except QueryError as exc:
        return f"{server} answered a cursor that is not one: {exc}"


def key_of(view: StoreView, key_text: str):
    """A key from its (decoded) text in a path: as it is for a string-keyed store, else JSON."""
    return key_text if isinstance(view.key_serde, StringSerde) else json.loads(key_text)


def _flag(query: dict, name: str) -> bool:
    return query.get(name, [""])[-1].lower() in ("true", "1", "yes")
