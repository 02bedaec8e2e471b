"""Helpers that several `tailguard` commands share: the one-line usage error, and the
one place that decides where a command reads the trace log from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # observe.query loads DuckDB: only the commands that query pay for it
    from observe.query import QueryResult

# Each way to reach a trace log, as its option reads in a usage message.
FLAGS = {"db": "--db FILE", "url": "--url URL", "archive": "--archive DIR"}


def one_line(exc: Exception) -> str:
    """`exc`'s message with every run of whitespace (newlines too) made one space, so a
    usage error stays on the one line `tailguard.cli.Group` promises."""
    return " ".join(str(exc).split())


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Where a command reads the trace log: a file no server holds (`db`), a running
    server through its admin API (`url`, with `token_file`), or a Parquet archive
    directory (`archive`). Exactly one of the three is set."""

    db: str | None = None
    url: str | None = None
    archive: str | None = None
    token_file: str | None = None

    @classmethod
    def pick(cls, token_file: str | None = None, **given: str | None) -> TraceSource:
        """The one source given among `given` (the command's --db/--url/--archive);
        UsageError unless exactly one is set, QueryError if a file or folder is missing."""
        if [bool(v) for v in given.values()].count(True) != 1:
            flags = [FLAGS[name] for name in given]
            raise click.UsageError("give exactly one of " + ", ".join(flags[:-1])
                                   + " or " + flags[-1])
        return cls(token_file=token_file, **given)

    def check_exists(self) -> None:
        """QueryError naming a trace file or archive directory that is not there."""
        from observe.query import QueryError

        if self.archive and not os.path.isdir(self.archive):
            raise QueryError(f"no such archive directory: {self.archive}")
        if self.db and not os.path.exists(self.db):
            raise QueryError(f"no such trace log: {self.db}")

    def query(self, sql: str, max_rows: int = 10_000, timeout_s: float = 10.0) -> QueryResult:
        """One read-only query (`timeout_s` holds for a file; a server keeps its own)."""
        if self.archive:
            from observe.archive import query_archive

            return query_archive(self.archive, sql, max_rows=max_rows)
        if self.db:
            from observe.query import query_file

            return query_file(self.db, sql, max_rows=max_rows, timeout_s=timeout_s)
        from tailguard.remote import query_url

        return query_url(self.url, sql, self.token_file, max_rows)

    def checked(self, sql: str, max_rows: int = 10_000, timeout_s: float = 10.0) -> QueryResult:
        """`query`, with a QueryError made a one-line usage error."""
        from observe.query import QueryError

        try:
            return self.query(sql, max_rows=max_rows, timeout_s=timeout_s)
        except QueryError as exc:
            raise click.UsageError(one_line(exc))

    def columns_and_rows(self, max_rows: int, timeout_s: float):
        """`sql -> (columns, rows)`, what the SLO and simulation packages read with."""
        def run(sql: str) -> tuple[list[str], list[tuple]]:
            result = self.checked(sql, max_rows, timeout_s)
            return result.columns, result.rows

        return run

    def slo_status(self, slo_file: str | None) -> dict:
        """The `/admin/slo` body: the server's own, or judged here on a file against
        `slo_file` (default: the shipped spec)."""
        if self.url:
            from tailguard.remote import admin_token, post_admin

            return post_admin(self.url, "/admin/slo", None, admin_token(self.token_file))
        from observe.query import query_file
        from slo.loading import load_spec
        from slo.report import slo_status

        spec = load_spec(slo_file)
        self.check_exists()
        return slo_status(partial(query_file, self.db, timeout_s=60), spec)
