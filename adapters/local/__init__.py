"""What the `apexps` command runs on this machine: a local Kafka, Spark sessions
and the Maven jars they need.
"""
