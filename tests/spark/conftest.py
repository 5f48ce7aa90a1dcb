"""One SparkSession (local[2], UI off) and one Shoal broker for the whole Spark suite: each costs seconds."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.external import ExternalBroker, external_bootstrap

pytest.importorskip("pyspark", reason="the Spark tests need pyspark (test extras)")
pytest.importorskip("pyarrow", reason="Python data sources need pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("the Spark tests need a Java 17+ runtime", allow_module_level=True)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A short heartbeat interval gets share consumers their first assignment sooner. The session timeout stays
# at its default (45 s): a query restarted after a crash must not need the killed member to time out.
# The lock bounds are widened so tests can set very long locks (records must come back without waiting
# for one) and very short ones (a batch must outlive its lock).
BROKER_OVERRIDES = [
    "group.share.min.heartbeat.interval.ms=1000",
    "group.share.heartbeat.interval.ms=1000",
    "group.share.min.record.lock.duration.ms=1000",
    "group.share.max.record.lock.duration.ms=3600000",
]


def spark_env() -> dict[str, str]:
    """Environment for Spark driver processes: workers must run this interpreter (it has shoal and pyarrow)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    for key, value in spark_env().items():
        os.environ.setdefault(key, value)
    from pyspark.sql import SparkSession

    session = (
        # Two tries per task (local[N, maxFailures]): a task that fails once is retried, as on a cluster.
        SparkSession.builder.master("local[2,2]")
        .appName("shoal-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # Registered explicitly: the module's import-time registration does nothing if another test
    # imported it before this session existed.
    from shoal.client.spark.source import register

    register(session)

    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess | ExternalBroker]:
    bootstrap = external_bootstrap()
    if bootstrap is not None:  # only tests marked `external` get this far (tests/conftest.py)
        yield ExternalBroker(bootstrap)
        return
    base = tmp_path_factory.mktemp("spark-broker")
    proc = BrokerProcess(base / "data", overrides=BROKER_OVERRIDES).start()
    yield proc
    proc.stop()
