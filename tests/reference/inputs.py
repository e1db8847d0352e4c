"""The inputs both sides read: written once per (twin, seed), as users' topics hold them.

Keys from a small alphabet (so keys repeat, join and aggregate) and now and then null; values
strings of small integers and now and then null (a tombstone); the input topics interleaved at
random; timestamps mostly rising, some out of order, some late beyond any grace; now and then a
wall-clock step.
"""

from __future__ import annotations

import random

from processor.serde import Serdes

_S = Serdes.string()
KEYS = "abcdef"


def generate(topics: list[str], seed: int, n: int, null_keys: bool = True) -> list[tuple]:
    """``n`` steps: ``(topic, key bytes, value bytes, ts)`` records and ``("advance", ms)``."""
    rng = random.Random(seed)
    steps: list[tuple] = []
    now = rng.randrange(0, 50)
    for _ in range(n):
        if rng.random() < 0.01:
            steps.append(("advance", rng.choice([10, 1000, 60_000])))
            continue
        topic = rng.choice(topics)
        now += rng.choice([0, 0, 1, 1, 2, 3, 5])
        r = rng.random()
        ts = now if r < 0.8 else max(0, now - rng.randrange(1, 12)) if r < 0.95 else max(0, now - rng.randrange(12, 60))
        key = None if null_keys and rng.random() < 0.02 else rng.choice(KEYS)
        value = None if rng.random() < 0.1 else str(rng.randrange(0, 10))
        steps.append((topic, None if key is None else _S.serialize(key),
                       None if value is None else _S.serialize(value), ts))
    return steps


def encoded(steps: list[tuple], serdes: dict[str, tuple[str, str]]) -> list[tuple]:
    """``steps`` with the records of the topics in ``serdes`` (``{topic: (key serde, value serde)}``,
    names of ``"string"``, ``"integer"``, ``"long"``) written with those serdes: a key letter as
    its index in ``KEYS``, a value as its number."""
    if not serdes:
        return steps
    def convert(b: bytes | None, name: str, key: bool) -> bytes | None:
        if b is None or name == "string":
            return b
        text = b.decode()
        n = KEYS.index(text) if key else int(text)
        return {"integer": Serdes.integer(), "long": Serdes.long()}[name].serialize(n)
    out = []
    for s in steps:
        if s[0] in serdes:
            ks, vs = serdes[s[0]]
            s = (s[0], convert(s[1], ks, True), convert(s[2], vs, False), s[3])
        out.append(s)
    return out
