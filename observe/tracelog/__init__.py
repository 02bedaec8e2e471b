"""The DuckDB trace log: the writer (`writer`), the frames on their way into DuckDB
(`store`) and the spool that makes them durable first (`spool`), and how the file is
set up (`setup`)."""

from observe.tracelog.writer import CONVERT_CHUNK_ROWS, TraceLog

__all__ = ["CONVERT_CHUNK_ROWS", "TraceLog"]
