"""The audit (issue 19 item 3): did every source's messages reach the journal without a silent
hole, and did every subscriber's link carry exactly what it should have?

Pure DataFrame -> DataFrame functions over the decoded topics (broker/spark/journal_reader.py,
readers.py), small modules, one concern each:

- findings.py: the categories and the one layout every check's findings share;
- sources.py: per source, every seq accounted for (holes, duplicates, order, first and last);
- links.py: the link log's records, link seqs, deliveries, and its duplicates and reorders;
- registry.py: subscriptions' lifetimes and permission-token verdicts over time (driver-side);
- decisions.py: the decision replay per (message, subscription) and its findings;
- job.py: `audit()`, all of it over one window; summary.py: summary.json and the report's
  series; message.py: `--message SOURCE:SEQ`.

The launcher is adapters/cli/audit_cmd.py; docs/audit.md says what each finding means and what
the evidence in Kafka can and cannot prove.
"""

from broker.spark.audit.findings import CATEGORIES, FINDING_COLUMNS
from broker.spark.audit.job import DEFAULT_EDGE_MS, Audit, AuditInputs, AuditOptions, audit

__all__ = ["CATEGORIES", "DEFAULT_EDGE_MS", "FINDING_COLUMNS", "Audit", "AuditInputs",
           "AuditOptions", "audit"]
