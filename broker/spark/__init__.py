"""Spark jobs over apexps's Kafka topics: pure DataFrame -> DataFrame functions plus thin loaders.

- source.py: Spark's Kafka source over one topic, bounded by offsets or by time;
- avro_decode.py: records decoded in the JVM (spark-avro's `from_avro`, per schema fingerprint);
- journal_reader.py: the journal; readers.py: the link log, the registries, the item store.
- fields.py: the selectable fields of every DATA record (extracted where the record has none);
- replay.py: a topic's messages as a subscriber receives them (`apexps replay`).

pyspark is imported lazily inside functions so the live broker never needs a JVM.
"""
