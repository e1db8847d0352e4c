"""The README's first command: ``processor demo`` runs end to end on the embedded local broker
and checks every output against the test driver (exit 0 only if all of them agree)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_processor_demo_runs_end_to_end_on_the_embedded_broker(report):
    p = subprocess.run([sys.executable, "-m", "processor.cli", "demo", "--records", "800"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    checks = re.findall(r"equals the test driver's.*: (yes|NO)", p.stdout)
    assert checks == ["yes"] * 6, p.stdout[-3000:]
    # the poison order in the dead-letter topic, named by its KIP-1034 position headers
    assert re.search(r"-dlq\s+1\n.*headers=\{'topic': 'orders-[^']+', 'partition': '\d+', 'offset': '\d+'\}",
                     p.stdout), p.stdout[-3000:]
    # the short report: no topology dump unless --describe; the per-operator table
    assert "Sub-topology" not in p.stdout
    rows = re.findall(r"^(table \S+|\S+ Emit\.\S+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)$", p.stdout, re.M)
    assert len(rows) == 5, p.stdout[-3000:]
    for what, n_in, emitted, changes, ratio in rows:
        n_in, emitted, changes = (int(x.replace(",", "")) for x in (n_in, emitted, changes))
        assert emitted <= n_in and changes <= n_in, what
        if "on_change" in what or what.startswith("table "):
            assert emitted == changes and ratio == "1.00", (what, emitted, changes)
    finished = re.search(r"demo finished in ([\d.]+) s", p.stdout)
    assert finished, p.stdout[-500:]
    report(f"processor demo: 6 outputs equal the test driver's, 1 record dead-lettered, {finished.group(1)} s")
