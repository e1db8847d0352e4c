"""The state directory as an operator meets it: copied while its worker runs, read-only, full, or
with a broken ``worker.id``. Each ends the worker that cannot use it with ONE line and exit 4
(``StateDirUnusable``), and a copy never fences the original (processor/runtime/worker_identity.py).

The read-only and full directories are tmpfs mounts of the test's own (this machine's tests run
as root); a run that cannot mount fails, naming why."""

import json
import shutil
import subprocess
import uuid

import pytest

from processor.kafka import clients as kafka
from tests.integration.helpers import start_worker_process, wait_until_group_drained
from tests.integration.test_operational_errors import assert_exit, run_args, run_worker


def good(amount):
    return json.dumps({"amount": amount}).encode()


def topics(bootstrap, unique):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    kafka.create_topics(bootstrap, {inp: 2, out: 1})
    return inp, out, app, {"APP_INPUT": inp, "APP_OUTPUT": out}


def produce(bootstrap, topic, records):
    from tests.integration.helpers import produce as produce_records

    produce_records(bootstrap, topic, records)


@pytest.fixture
def mount(tmp_path):
    """``mount(name, options)``: a tmpfs at ``tmp_path/name`` with ``options``, unmounted after."""
    mounted = []

    def make(name, options):
        path = tmp_path / name
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            pytest.fail(f"this test mounts a tmpfs (as root) and could not: {proc.stderr.strip()}")
        mounted.append(path)
        return path
    try:
        yield make
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_copied_state_directory_is_refused_in_one_line_and_the_original_runs_on(
        apache_kafka_bootstrap, unique, tmp_path):
    bootstrap = apache_kafka_bootstrap
    inp, out, app, env = topics(bootstrap, unique)
    log = tmp_path / "original.log"
    original = start_worker_process(bootstrap, "tests.integration.apps:filter_topology", app, tmp_path / "a", log,
                                    env, guarantee="exactly_once")
    try:
        produce(bootstrap, inp, [(b"a", good(150)), (b"b", good(300))])
        wait_until_group_drained(bootstrap, app, {inp: 2}, timeout_s=90,
                                 check=lambda: original.poll() is None or pytest.fail(log.read_text()[-3000:]))
        shutil.copytree(tmp_path / "a", tmp_path / "b")   # worker.id and all, while the original runs
        copy = run_worker(run_args("filter_topology", bootstrap, app, tmp_path / "b",
                                   "--processing-guarantee", "exactly_once"), env, timeout=90)
        line = assert_exit(copy, 4, "is claimed by another live worker", "the state directory was copied",
                           str(tmp_path / "b"))
        worker_id = (tmp_path / "a" / app / "worker.id").read_text().strip()
        assert worker_id in line and f"{original.pid}." in line
        # the original was never fenced: it processes what comes next
        produce(bootstrap, inp, [(b"c", good(400)), (b"d", good(5))])
        wait_until_group_drained(bootstrap, app, {inp: 2}, timeout_s=90,
                                 check=lambda: original.poll() is None or pytest.fail(log.read_text()[-3000:]))
        assert original.poll() is None
    finally:
        original.terminate()
        original.wait(60)
    text = log.read_text()
    assert "fenced" not in text and "Traceback" not in text, text[-3000:]
    outs = [(m.key(), m.value()) for m in kafka.read_topic(bootstrap, out)]
    assert sorted(outs) == [(b"a", good(150)), (b"b", good(300)), (b"c", good(400))]


def test_a_read_only_state_directory_is_one_line(kafka_bootstrap, unique, mount):
    inp, out, app, env = topics(kafka_bootstrap, unique)
    state = mount("ro", "ro,size=1m")
    proc = run_worker(run_args("filter_topology", kafka_bootstrap, app, state), env)
    assert_exit(proc, 4, f"state directory {state}/{app} cannot be used", "Read-only file system")


def test_a_full_state_directory_is_one_line(kafka_bootstrap, unique, mount):
    inp, out, app, env = topics(kafka_bootstrap, unique)
    state = mount("full", "size=64k")
    produce(kafka_bootstrap, inp, [(f"k{i}".encode(), good(150 + i)) for i in range(200)])
    proc = run_worker(run_args("filter_topology", kafka_bootstrap, app, state), env)
    assert_exit(proc, 4, "the state directory cannot be used", "No space left on device")


def test_a_broken_worker_id_is_one_line(kafka_bootstrap, unique, tmp_path):
    inp, out, app, env = topics(kafka_bootstrap, unique)
    (tmp_path / "s" / app).mkdir(parents=True)
    (tmp_path / "s" / app / "worker.id").write_bytes(b"\xff\xfe" + uuid.uuid4().bytes)
    proc = run_worker(run_args("filter_topology", kafka_bootstrap, app, tmp_path / "s"), env)
    assert_exit(proc, 4, f"{tmp_path / 's' / app / 'worker.id'} does not hold a worker id", "delete the file")
