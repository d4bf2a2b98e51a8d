"""The apexps domain and its Kafka journal. Nothing here knows the wire (BEEP/APEX)."""

import common  # noqa: F401  (first: it installs the finder of the compiled message path)
