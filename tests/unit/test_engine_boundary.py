"""The engine is host-neutral: ``processor.engine``, ``processor.operators``, the DSL and the
test driver import neither confluent_kafka nor rocksdict (checked in a fresh interpreter where
importing either fails), and a topology runs there end to end."""

import subprocess
import sys

CODE = r'''
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("confluent_kafka", "rocksdict"):
            raise ImportError(f"host-specific module {name} imported by the engine")
sys.meta_path.insert(0, Blocker())
import pkgutil, importlib
import processor.engine, processor.operators
for pkg in (processor.engine, processor.operators):
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
from processor import StreamsBuilder
from processor.testing import TopologyTestDriver
b = StreamsBuilder()
o = b.table("orders")
o.join_on_foreign_key(b.table("customers"), lambda v: v["c"], lambda a, c: [a, c], how="left").to_stream().to("out")
with TopologyTestDriver(b.build()) as d:
    d.pipe_input("customers", "c1", {"n": 1}, timestamp=1)
    d.pipe_input("orders", "o1", {"c": "c1"}, timestamp=2)
    print([(r.key, r.value) for r in d.read_output("out")])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("confluent_kafka", "rocksdict")))
'''


def test_engine_operators_and_driver_need_no_kafka_client_and_no_rocksdb():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[('o1', [{'c': 'c1'}, {'n': 1}])]", "[]"]
