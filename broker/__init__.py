"""The apexps domain and its Kafka journal. Nothing here knows the wire (BEEP/APEX)."""
