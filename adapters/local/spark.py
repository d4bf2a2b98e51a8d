"""A local SparkSession with Spark's Kafka source and spark-avro on the classpath.

The jars are resolved from Maven Central by `ops/spark/pom.xml` (cached, see
adapters/local/provision.py) rather than by `spark.jars.packages`, so a session start never reaches
the network once the cache is warm, and so both versions are pinned next to pyspark's: the Kafka
source reads apexps's topics, spark-avro's `from_avro` decodes their records in the JVM
(broker/spark/avro_decode.py).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from adapters.local.provision import OPS_DIR, resolve_jars

__all__ = ["SPARK_POM", "connector_version", "kafka_connector_jars", "local_session"]

SPARK_POM = OPS_DIR / "spark" / "pom.xml"


#: The Spark artifacts the pom pins, each at pyspark's version.
_ARTIFACTS = ("spark-sql-kafka-0-10_2.13", "spark-avro_2.13")


def connector_version(artifact: str = "spark-sql-kafka-0-10_2.13") -> str:
    match = re.search(re.escape(artifact) + r"</artifactId>\s*<version>([^<]+)<",
                      SPARK_POM.read_text())
    if match is None:  # pragma: no cover - the pom ships with the package
        raise RuntimeError(f"no {artifact} version in {SPARK_POM}")
    return match.group(1)


def kafka_connector_jars() -> list[Path]:
    """The Kafka source's and spark-avro's jars (and what they need that pyspark lacks)."""
    import pyspark

    for artifact in _ARTIFACTS:
        pinned = connector_version(artifact)
        if pyspark.__version__ != pinned:
            raise RuntimeError(
                f"pyspark {pyspark.__version__} is installed but {SPARK_POM} pins {artifact} "
                f"{pinned}; reinstall with `pip install pyspark=={pinned}` (see pyproject.toml)"
            )
    wanted = pyspark.__version__
    # pyspark already ships Spark, Scala and Hadoop; add only what it lacks.
    shipped = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in resolve_jars(SPARK_POM, f"spark-kafka-{wanted}") if j.name not in shipped]


def local_session(
    app_name: str = "apexps",
    master: str = "local[2]",
    *,
    with_kafka: bool = True,
    conf: dict[str, str] | None = None,
) -> Any:
    """Start (or reuse) a SparkSession; `master` may name a real cluster instead of local[2]."""
    from pyspark.sql import SparkSession

    # Workers must run the driver's interpreter (the venv), not whatever `python3` is first on
    # PATH, or they cannot import apexps; local mode reads this from the environment.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # Small data, two cores: the default 200 shuffle partitions would be 200 tiny tasks.
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
    )
    if with_kafka:
        builder = builder.config("spark.jars", ",".join(str(p) for p in kafka_connector_jars()))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
