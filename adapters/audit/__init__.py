"""What a person reads of an audit: `report.write_report` turns the audit's `ReportData` (the
summary.json it wrote plus a few small series) into one self-contained `report.html`.

The reconciliation itself is Spark work in broker/spark/audit/; this package only presents it,
and imports matplotlib only when a report is written.
"""
