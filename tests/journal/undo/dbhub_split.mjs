// DBHub's own splitSQLStatements (the pinned @bytebase/dbhub's dist), over texts read as JSON from stdin:
// [[text, dialect], ...] in, [[piece, ...], ...] out. Used by test_sql_splitting.py.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dist = process.argv[2];
const chunk = readdirSync(dist).find((name) => name.endsWith(".js")
  && readFileSync(join(dist, name), "utf8").includes("function splitSQLStatements("));
const { splitSQLStatements } = await import(pathToFileURL(join(dist, chunk)).href);
const texts = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(texts.map(([text, dialect]) => splitSQLStatements(text, dialect))));
