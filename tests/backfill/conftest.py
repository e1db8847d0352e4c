"""Backfill tests run on a real local Spark (one session for the whole run: it costs ~7 s to
start) and, where they read Kafka, on the real broker of ``tests/conftest.py``."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    # Python workers must run this interpreter (the venv with processor, backfill, pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder
               .master("local[2]")
               .appName("processor-backfill-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster (one worker, 2 cores) whose executors see none of the driver's
    files: the worker runs in a private mount namespace with a tmpfs over the test's temporary
    directories (state directories, build roots, application modules written there) and over the
    repository's ``tests`` package (``tests/support/spark_cluster.py``). Started on first use."""
    import tempfile
    from pathlib import Path

    from tests.support.spark_cluster import StandaloneCluster

    repo_tests = Path(__file__).resolve().parent.parent
    hide = [str(tmp_path_factory.getbasetemp()), tempfile.gettempdir(), str(repo_tests)]
    cluster = StandaloneCluster(hide, tmp_path_factory.mktemp("spark-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
