"""Named limits that keep hostile selectors and messages from costing more than they should.

A selector arrives in a subscribe request from a peer we may not trust, and it is compiled once
but evaluated against every message of the topic; a message is parsed once per publish. Each
limit below caps one way of making either step expensive, and every rejection is a 567 (selector)
or 561 (message) with a reason, never a hang or a crash.
"""

from __future__ import annotations

#: Longest selector text accepted, in characters; longer ones are rejected (567). 64 KiB is far
#: above any hand-written selector (an IN list of 5,000 four-letter symbols fits in 45 KB) and
#: the same order as ActiveMQ's and Solace's subscription limits; every compiler pass is linear,
#: so this bounds compile time to a few milliseconds and per-subscription memory to a few
#: hundred KB.
DEFAULT_MAX_SELECTOR_LENGTH = 64 * 1024

#: Deepest nesting accepted (parentheses, NOT, unary signs, arithmetic chains; LDAP `(&(|(!…`),
#: rejected beyond it (567). The parsers keep an explicit stack, so this bounds the depth of the
#: compiled tree, which the Python evaluator and the Spark compiler each recurse over once per
#: level (a few hundred frames below Python's default limit of 1000 even at 256), and which
#: Spark's SQL parser then reads on the JVM stack. That last reader sets the figure: on a fresh
#: session with the default 1 MB thread stack, Spark 4's parser overflows ("too complex to
#: parse") somewhere between 192 and 255 levels of alternating AND/OR, right-nested arithmetic or
#: (&(|…)) filters, however shallow `_spark.py` writes them; every shape tried parses at 192.
#: 128 keeps a 1.5x margin there and is still far above what conformance suites exercise (JMS
#: corpora nest NOT ( … ) 50 deep, 100 levels here) or anyone writes by hand. (A driver started
#: with -Xss16m parses 256; raise this only together with that.) Not yet solved: a random mix
#: of NOT / AND / OR wrappers 60-128 deep, each level adding a predicate, takes Spark's parser
#: seconds (23 s for one 20 KB expression) and one such selector exhausted a 2 GB driver; the
#: cure is to build the boolean skeleton with the Column API and parse only atoms as SQL.
DEFAULT_MAX_NESTING = 128

#: Most atomic predicates one selector holds (567 beyond); an IN list is one, whatever its
#: length. Each atom costs a pass over the instances of what it reads, for every message of the
#: topic, and an atom the subscription index cannot key on (OR branches, LIKE, LDAP substrings
#: and case-folded equality) re-reads its values itself: `(|(x=1)(x=2)…)` with 12,000 branches
#: (60 KB, under the length limit) took 6.4 s per message whose x is 1 MB long, in the live
#: index. 256 keeps that worst case to about a hundredth of it, still far above hand-written
#: selectors (the draft's running example has three). The cure for the rest is to fold each
#: value once per message, not once per atom.
DEFAULT_MAX_ATOMS = 256

#: Most instance bindings one atomic predicate evaluates. A predicate reading several repeated
#: identifiers (`a = b`) is evaluated over the cross product of their instances, which a message
#: with many repeats could blow up quadratically or worse. Beyond this many bindings the predicate
#: is UNKNOWN, in both backends alike. Predicates over a single identifier are linear in its
#: instances and never hit this.
DEFAULT_MAX_BINDINGS = 10_000

#: Largest XML message `extract_fields` parses, in bytes (561 beyond). Equal to the default
#: maximum publish size elsewhere in the broker's order of magnitude; the DOM costs ~10x this.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: Deepest element nesting `extract_fields` accepts (561 beyond). An element's value is its whole
#: text content, so each level of nesting re-reads the text below it: depth bounds that cost.
#: libxml2 itself stops at 256 without huge_tree.
DEFAULT_MAX_XML_DEPTH = 64

#: Most field instances (element and attribute values) one message yields (561 beyond), which
#: bounds the stored field map and the per-message cost of any-instance evaluation.
DEFAULT_MAX_FIELD_INSTANCES = 20_000
