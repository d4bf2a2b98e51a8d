"""Operations: provisioning the local Kafka and Spark jars, launchers and benchmarks."""
