"""What the `apexps` command runs on this machine besides the broker: a local Kafka
(`kafka.LocalKafka`, `apexps kafka start`), local Spark sessions with the Kafka connector
(`spark.local_session`) and the Maven jars both need (`provision.resolve_jars`).

The Maven files stay in ops/ with the other build files (ops/kafka/pom.xml, ops/spark/pom.xml,
ops/maven-settings.xml) and are read by path from the checkout apexps was installed from:
`pip install -e` (ops/bootstrap, the Dockerfile) keeps that checkout, and a pom is a build file
a release would pin, not data a wheel should carry two copies of. APEXPS_OPS_DIR points at
another copy; without one, `apexps kafka start` says which file it could not find.

Nothing here is imported at package import: each module pulls in what it needs (Java, Maven,
pyspark) only when used.
"""
