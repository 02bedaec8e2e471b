"""The trace log: ingest, SLO status and the documented queries over a large log, and
archive rotation."""
