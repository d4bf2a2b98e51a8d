"""Spark jobs over the journal: pure DataFrame -> DataFrame functions plus thin loaders.

pyspark is imported lazily inside functions so the live broker never needs a JVM.
"""
