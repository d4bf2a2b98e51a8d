"""A SparkSession (local, or on any Spark cluster) with Spark's Kafka source and spark-avro on
the classpath, and apexps's own Python shipped to the executors when they are not local.

The jars are resolved from Maven Central by `ops/spark/pom.xml` (cached, see
adapters/local/provision.py) rather than by `spark.jars.packages`, so a session start never reaches
the network once the cache is warm, and so both versions are pinned next to pyspark's: the Kafka
source reads apexps's topics, spark-avro's `from_avro` decodes their records in the JVM
(broker/spark/avro_decode.py). `spark.jars` are the driver's: Spark serves them to every
executor itself, on a cluster as in local mode.

On a cluster (`master` not `local[...]`), the executors run Python too (the decode's fallback
UDF, selector UDFs, the audit's), and they cannot be assumed to have apexps installed: a node
gets pyspark and apexps's dependencies from its image, the job's own code from the job. So
`session` ships it the way a PySpark user ships theirs: a zip of the `common` and `broker`
packages added with `addPyFile` (put on each executor's Python path), and the Avro schemas in a
zip added with `addArchive` (unpacked as a directory) and named by APEXPS_AVRO_DIR in the
executors' environment (a package in a zip cannot read its schemas from the directory beside
it; broker/codec.py reads that variable).
The zip is pure Python: the C accelerators are optional and fall back when absent. `adapters`
is not shipped: executors only run `broker` code (the layering guarantees it).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from adapters.local.provision import OPS_DIR, resolve_jars

__all__ = [
    "SPARK_POM", "connector_version", "is_local", "kafka_connector_jars", "local_session",
    "python_bundle", "session",
]

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


def is_local(master: str) -> bool:
    """Whether `master` runs executors inside the driver's JVM (local, local[N], local[*])."""
    return master == "local" or master.startswith("local[")


#: What executors import of apexps (see the module docstring).
_SHIPPED_PACKAGES = ("common", "broker")
#: The name the shipped schemas are unpacked under in each executor's working directory.
_SHIPPED_AVRO = "apexps-avro"


def python_bundle(dest_dir: Path) -> tuple[Path, Path]:
    """Zip `common` and `broker` (their .py files and py.typed), and the Avro schemas, into
    `dest_dir`; return (the packages' zip, the schemas' zip)."""
    import broker
    from broker.codec import AVRO_DIR

    root = Path(broker.__file__).resolve().parent.parent
    packages, schemas = dest_dir / "apexps-py.zip", dest_dir / f"{_SHIPPED_AVRO}.zip"
    with zipfile.ZipFile(packages, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in _SHIPPED_PACKAGES:
            for path in sorted((root / package).rglob("*")):
                if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                    zf.write(path, path.relative_to(root).as_posix())
    with zipfile.ZipFile(schemas, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(AVRO_DIR.glob("*.avsc")):
            zf.write(path, path.name)
    return packages, schemas


def _shipped(spark: Any) -> bool:
    """Whether the running context has apexps's Python already: a second `session` call in one
    process (a command run inside a job) gets the running context back, and Spark refuses a
    file name added again from another path."""
    return any(f"{_SHIPPED_AVRO}.zip" in path for path in spark.sparkContext.listArchives)


def local_session(
    app_name: str = "apexps",
    master: str = "local[2]",
    *,
    with_kafka: bool = True,
    conf: dict[str, str] | None = None,
) -> Any:
    """Start (or reuse) a SparkSession; `master` may name a real cluster instead of local[2].

    (The name is older than cluster support; `session` is the same call.)
    """
    return session(app_name, master, with_kafka=with_kafka, conf=conf)


def session(
    app_name: str = "apexps",
    master: str = "local[2]",
    *,
    with_kafka: bool = True,
    conf: dict[str, str] | None = None,
    ship_python: bool | None = None,
) -> Any:
    """Start (or reuse) a SparkSession on `master` (local[N] or a cluster's URL).

    `ship_python` (default: when `master` is not local) sends apexps's Python and Avro schemas
    to the executors, as the module docstring says.
    """
    from pyspark.sql import SparkSession

    ship = not is_local(master) if ship_python is None else ship_python
    # Workers must run the driver's interpreter (the venv), not whatever `python3` is first on
    # PATH, or they cannot import apexps; local mode reads this from the environment. (On a
    # cluster whose nodes keep Python elsewhere, set PYSPARK_PYTHON to it before calling.)
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
    if ship:
        # Relative: an executor's Python runs in the executor's working directory, where
        # addArchive unpacks what it ships, under the name after the '#'.
        builder = builder.config("spark.executorEnv.APEXPS_AVRO_DIR", _SHIPPED_AVRO)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if ship and not _shipped(spark):
        # (The zip must outlive the call: the driver serves it to executors as they start.)
        packages, schemas = python_bundle(Path(tempfile.mkdtemp(prefix="apexps-spark-")))
        spark.sparkContext.addPyFile(str(packages))
        # (addFile takes no local directory on a cluster; an archive is unpacked as one.)
        spark.sparkContext.addArchive(f"{schemas}#{_SHIPPED_AVRO}")
    return spark
