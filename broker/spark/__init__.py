"""Spark jobs over apexps's Kafka topics: pure DataFrame -> DataFrame functions plus thin loaders.

- source.py: Spark's Kafka source over one topic, bounded by offsets or by time;
- avro_decode.py: records decoded in the JVM (spark-avro's `from_avro`, per schema fingerprint);
- journal_reader.py: the journal; readers.py: the link log, the registries, the item store.

pyspark is imported lazily inside functions so the live broker never needs a JVM.
"""
