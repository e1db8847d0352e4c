"""Benchmark: the HTTP endpoint's probes while clients scan a store (issue 47 item 4).

    python benchmarks/http_probes.py                      # local Tansu broker, 40,000 accounts
    python benchmarks/http_probes.py --apache-kafka --clients 20 --seconds 20
    python benchmarks/http_probes.py --bootstrap-servers host:9092 --limit 10000

A table of N accounts (JSON values of ~500 bytes, 4 partitions) in one worker process, ``processor
run`` as a user starts it with ``--http-port`` (and ``--http-auth-token-file`` with ``--token``).
Once the worker is ready and the table loaded, ``--clients`` threads ask
``GET /stores/accounts?prefix=&limit=L`` over and over (one connection each per request), while
one more thread asks ``GET /healthz`` every 0.1 s on a new connection, as a Kubernetes probe does,
for ``--seconds``. Printed: the probes' latency (median, 95th percentile, max, how many took
1 s or more: Kubernetes' default probe timeout), the scans answered, their size and duration, and
how far the worker's main loop fell behind (``processor_main_loop_age_seconds``, scraped from
/metrics every 0.1 s: the loop is held while it answers a scan).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.local_broker import free_port  # noqa: E402
from processor.serde import Serdes  # noqa: E402

PARTS = 4


def topology():
    """The accounts table (``$BENCH_INPUT``) in store ``accounts``: the worker's topology."""
    b = StreamsBuilder()
    b.table(os.environ["BENCH_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json(), store_name="accounts")
    return b.build()


def load(bootstrap: str, topic: str, n: int) -> None:
    rnd = random.Random(5)
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(n):
        v = {"name": f"user {i}", "ssn": f"{rnd.randrange(10**9):09d}", "password_hash": f"{rnd.getrandbits(256):064x}",
             "address": " ".join(f"street-{rnd.randrange(10**6)}" for _ in range(25))}
        produce(p, topic, json.dumps(v).encode(), f"acct-{i:06d}".encode())
    p.flush()


def get(port: int, path: str, token: str | None, timeout_s: float = 60.0) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", default=None)
    ap.add_argument("--apache-kafka", action="store_true")
    ap.add_argument("--accounts", type=int, default=40_000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--limit", type=int, default=1_000_000_000)
    ap.add_argument("--token", default=None, help="serve with --http-auth-token-file (this token); scans send it")
    args = ap.parse_args()
    run_id = f"{int(time.time())}-{os.getpid()}"
    topic, app = f"bench-http-{run_id}", f"bench-http-{run_id}"
    with broker(args.bootstrap_servers, args.apache_kafka) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        kafka.create_topics(bootstrap, {topic: PARTS})
        load(bootstrap, topic, args.accounts)
        port = free_port()
        extra = []
        if args.token:
            (Path(tmp) / "token").write_text(args.token + "\n")
            extra = ["--http-auth-token-file", str(Path(tmp) / "token")]
        env = dict(os.environ, BENCH_INPUT=topic,
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parent.parent)]))
        log_path = Path(tmp) / "worker.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "processor.cli", "--log-level", "INFO", "run", "http_probes:topology",
             "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(Path(tmp) / "state"),
             "--http-port", str(port), *extra], env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the worker did not load the table within 120 s"
                try:
                    status, body = get(port, "/stores/accounts?prefix=&limit=1000000000", args.token)
                    if status == 200 and "next" not in json.loads(body) and \
                            len(json.loads(body)["entries"]) == args.accounts:
                        break
                    if status == 200 and "next" in json.loads(body):   # a capped limit: count the pages
                        n, cursor = 0, None
                        while True:
                            q = "/stores/accounts?prefix=" + (f"&after={cursor}" if cursor else "")
                            page = json.loads(get(port, q, args.token)[1])
                            n += len(page["entries"])
                            cursor = page.get("next")
                            if not cursor:
                                break
                        if n == args.accounts:
                            break
                except (urllib.error.URLError, ConnectionError, ValueError, KeyError):
                    pass
                time.sleep(0.5)
            stop = threading.Event()
            scans: list[tuple[float, int, int]] = []
            probes: list[float] = []
            probe_errors: list[str] = []
            ages: list[float] = []

            def scanner() -> None:
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        status, body = get(port, f"/stores/accounts?prefix=&limit={args.limit}", args.token)
                    except OSError:
                        continue
                    scans.append((time.monotonic() - t0, status, len(body)))

            def prober() -> None:
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        status, _ = get(port, "/healthz", None, timeout_s=10)
                        if status != 200:
                            probe_errors.append(f"HTTP {status}")
                    except OSError as exc:
                        probe_errors.append(f"{type(exc).__name__}: {exc}")
                    probes.append(time.monotonic() - t0)
                    stop.wait(0.1)

            def loop_age() -> None:
                while not stop.is_set():
                    try:
                        text = get(port, "/metrics", args.token, timeout_s=10)[1].decode()
                        ages.extend(float(line.split()[-1]) for line in text.splitlines()
                                    if line.startswith("processor_main_loop_age_seconds "))
                    except OSError:
                        pass
                    stop.wait(0.1)

            threads = [threading.Thread(target=scanner, daemon=True) for _ in range(args.clients)]
            threads += [threading.Thread(target=prober, daemon=True), threading.Thread(target=loop_age, daemon=True)]
            for t in threads:
                t.start()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join(70)
        finally:
            proc.terminate()
            proc.wait(60)
    probes.sort()
    ok = [s for s in scans if s[1] == 200]
    print(f"{args.accounts} accounts, {args.clients} clients scanning limit={args.limit} for {args.seconds:.0f} s")
    print(f"/healthz: {len(probes)} probes, median {statistics.median(probes) * 1000:.0f} ms, "
          f"p95 {probes[int(len(probes) * 0.95)] * 1000:.0f} ms, max {probes[-1] * 1000:.0f} ms, "
          f">= 1 s: {sum(1 for p in probes if p >= 1.0)}, errors: {len(probe_errors)} {probe_errors[:3]}")
    if ok:
        print(f"scans: {len(ok)} answered 200 ({len(scans) - len(ok)} other: "
              f"{sorted({s[1] for s in scans if s[1] != 200})}), {statistics.mean(s[2] for s in ok) / 1e6:.2f} MB "
              f"each, median {statistics.median(s[0] for s in ok):.2f} s")
    if ages:
        print(f"main loop age (scraped): max {max(ages):.2f} s, median {statistics.median(ages):.3f} s")


if __name__ == "__main__":
    main()
