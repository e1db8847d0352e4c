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
    finished = re.search(r"demo finished in ([\d.]+) s", p.stdout)
    assert finished, p.stdout[-500:]
    report(f"processor demo: 6 outputs equal the test driver's, 1 record dead-lettered, {finished.group(1)} s")
