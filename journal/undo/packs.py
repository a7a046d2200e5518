"""Recipe packs for the official servers, written against the versions the conformance tests pin
(tests/conformance/package.json, pyproject.toml): `filesystem` (@modelcontextprotocol/server-filesystem),
`memory` (@modelcontextprotocol/server-memory) and `git` (mcp-server-git); and for the SQL servers people
run, whose every call is decided by its statements (journal.undo.database): `sqlite` (mcp-server-sqlite,
samples/third_party), `dbhub` (@bytebase/dbhub) and `postgres` (@modelcontextprotocol/server-postgres).
Each write tool is classified honestly; read-only tools need nothing (their servers say so). Each recipe
carries the digest of the input schema it was written for, so a server whose tool changed is not undone by a
stale recipe. No ORM.

tests/journal/undo/test_packs.py lists every pinned server and checks each recipe against its real catalogue.
"""

import copy
from typing import Any

# The schema digests of the pinned versions' tools (`recipes.schema_digest`).
_FS = {
    "write_file": "ce17c85e8a5883552a11555f9b893de497fadab965a5c7935c0cb8f3c55b91d6",
    "edit_file": "88459ef670b139a12a3e0335ae0a4584dd892f60f45f565b545e1004d7565dd5",
    "create_directory": "fc64d952de15bbe83e841a79d32385e4708e9758079b84dd233e485ce3c34720",
    "move_file": "621218ed9bc38b6cde9c6dc003583fb5778e5076bb28e25634b9070b33264682",
}
_MEMORY = {
    "create_entities": "c54813f3fc7a076c950320c90489cec6add7482d695e23e43f2b30b8f2b9f083",
    "create_relations": "5df4fdc93cbf199dff73ccc802d5cca510bd37eb7d99e0949fc0a17b261a65d3",
    "add_observations": "73c9d2bfd98581b3be93976c78e44389209f2f9ec63e8652fd9e84795616842b",
    "delete_entities": "a1bac527df1c3bd311c9c2bf2e9a9cf8ae5e266b690bd6c97d4a62e4af2dc731",
    "delete_observations": "6b96624fc9e8cfbb92d8c7672e16fe06218216634815f892c8027cf7162f8ea7",
    "delete_relations": "17985b44074691e832f8548bf2efc55af3256f9c52d3398c8ddc20141f2b0697",
}
_GIT = {
    "git_commit": "c5cd9087b800e226a17190a2b110c7d9fe5a1131288faeb0f21478403293b967",
    "git_add": "fe607783e69161974a5f7a4ccd35c37a74701420facc8f99a153e9e1bd268a00",
    "git_reset": "eea611c41ac2f0dac25fa3cc39a6b9692425bd6bc1de10c91e3ec81846c9707e",
    "git_create_branch": "fc11ec836b25b8e829547cdf19fb1808dc935595bf4b4370eabc5fc4a8a94e26",
    "git_checkout": "b655a056a01c07675207106a974e3c18649ad97cfe5049bbc68b5f033a8ce4d6",
}
_SQLITE = {
    "read_query": "991adb5dff15e2b173837367c3f391c1a7a1901168cc9677deff755c07303b8a",
    "write_query": "335b081f8028a304e55106c1fc221b8d045cab067fa1b04a027cf3550dfc591b",
    "create_table": "e9061b0c2b2cc138b4f6998e566f1e3ac6516f75f65284c70d74258cf7b0c3cd",
    "list_tables": "efddc7bd8bbcef73a14eb1ace1ffdaec81e518ef1e13c1e9271d0b8acb694a49",
    "describe_table": "b423e0671fc803b07eabc5908c6b55aa2329a51f81ec0a8ea6c7973b765d9b2a",
    "append_insight": "60d511d26c2f5e2908a8949d1a272d833bc005a824a7012fbbe50d73508ec82f",
}
_DBHUB_EXECUTE_SQL = "350fb021e6ede0128f13d7fbd4604f0978cc9f112b8aeddd9842aa8480a79f7c"
_POSTGRES_QUERY = "3ebb862b8ec5e1d9f2b25c650229632f2eed77de4c71c41dbec37b12e99fc6a0"
# The branch checked out, as git_status says it in text.
_ON_BRANCH = r"On branch (\S+)"

# The file as it was, read as text before the write, and written back.
_FILE_BEFORE = {"tool": "read_text_file", "arguments": {"path": "$request.body#/path"}}
_RESTORE_FILE = {"tool": "write_file", "arguments": {"path": "$request.body#/path",
                                                      "content": "$before.body#/content"}}
_NEW_FILE = {
    "matches": "ENOENT|no such file",
    "kind": "none",
    "reason": "The file did not exist before this call, which created it, and this server cannot delete "
              "files.",
    "remedy": "Delete the file by hand if it should not exist.",
}
_NOT_TEXT = {
    "at": "/content",
    "matches": "\ufffd",
    "reason": "The file was not valid text (the server read it with replacement characters), so its earlier "
              "bytes cannot go back through write_file.",
    "remedy": "Restore the file from a backup or version control.",
}


# An edit of a file that is not there changes nothing: the server refuses it.
_NO_FILE_TO_EDIT = {
    "matches": "ENOENT|no such file",
    "kind": "read_only",
    "reason": "The file did not exist when this call was made, and editing a file that does not exist "
              "changes nothing (the server refuses it).",
}


def _restore_file(tool: str, digest: str, missing: dict[str, Any] = _NEW_FILE) -> dict[str, Any]:
    return {"tool": tool, "schemaDigest": digest, "kind": "compensate", "does": "restore the file's earlier "
            "content, byte for byte", "read": _FILE_BEFORE, "version": "/content",
            "compensation": _RESTORE_FILE, "whenReadFails": missing, "refuseIfBefore": _NOT_TEXT}


def _nodes(names: str) -> dict[str, Any]:
    """The entities named (by a `*` binding over the call) and every relation to or from them."""
    return {"tool": "open_nodes", "arguments": {"names": names}}


# Both ends of each relation a call names.
_ENDS = ["$request.body#/relations/*/from", "$request.body#/relations/*/to"]


def _graph(tool: str, does: str, read: dict, compensation: dict, then=(), **more) -> dict[str, Any]:
    """A knowledge-graph recipe; its version is of what the call changes (`version`: only the relations, or
    only the entities with their observations), so a later change to the rest is no conflict."""
    return {"tool": tool, "schemaDigest": _MEMORY[tool], "kind": "compensate", "does": does, "read": read,
            "versionIgnoresOrder": True, "compensation": compensation, "then": list(then), **more}


PACKS: dict[str, list[dict[str, Any]]] = {
    "filesystem": [
        _restore_file("write_file", _FS["write_file"]),
        # edit_file rewrites CRLF line endings to LF: the earlier bytes, read before, go back exactly.
        _restore_file("edit_file", _FS["edit_file"], _NO_FILE_TO_EDIT),
        {"tool": "move_file", "schemaDigest": _FS["move_file"], "kind": "compensate",
         "does": "move it back to where it was",
         "compensation": {"tool": "move_file", "arguments": {"source": "$request.body#/destination",
                                                             "destination": "$request.body#/source"}},
         "sideEffect": "The server refuses to move it back if something is at the old path by then."},
        {"tool": "create_directory", "schemaDigest": _FS["create_directory"], "kind": "none",
         "reason": "This server cannot delete directories (and the call may have found the directory there).",
         "remedy": "Remove the directory by hand if it should not exist."},
    ],
    "memory": [
        # The server skips an entity whose name exists already and reports only what it added: only that is
        # deleted, so an entity that was there before survives.
        _graph("create_entities", "delete exactly the entities the call created",
               _nodes("$request.body#/entities/*/name"),
               {"tool": "delete_entities", "arguments": {"entityNames": "$response.body#/entities/*/name"}},
               sideEffect="Deleting an entity also deletes every relation to or from it."),
        # A relation touches both entities it names: a run that relates an entity it created is undone in
        # turn, the relation first, with no conflict.
        _graph("create_relations", "delete exactly the relations the call created",
               _nodes("$request.body#/relations/*/from"),
               {"tool": "delete_relations", "arguments": {"relations": "$response.body#/relations"}},
               version="/relations", touches=_ENDS),
        _graph("add_observations", "delete exactly the observations the call added",
               _nodes("$request.body#/observations/*/entityName"),
               {"tool": "delete_observations", "arguments": {"deletions": {
                   "$each": "$response.body#/results",
                   "as": {"entityName": "$item#/entityName", "observations": "$item#/addedObservations"}}}},
               version="/entities"),
        # Re-created from what was read before the delete: the entities, then every relation they had.
        _graph("delete_entities", "re-create the entities and every relation the delete took with them",
               _nodes("$request.body#/entityNames"),
               {"tool": "create_entities", "arguments": {"entities": "$before.body#/entities"}},
               then=[{"tool": "create_relations", "arguments": {"relations": "$before.body#/relations"}}]),
        # add_observations skips what is there already, so re-adding every earlier observation of the
        # entities puts back exactly the deleted ones.
        _graph("delete_observations", "add the deleted observations back",
               _nodes("$request.body#/deletions/*/entityName"),
               {"tool": "add_observations", "arguments": {"observations": {
                   "$each": "$before.body#/entities",
                   "as": {"entityName": "$item#/name", "contents": "$item#/observations"}}}},
               version="/entities"),
        # create_relations skips what is there already: the earlier relations of the entities, put back.
        _graph("delete_relations", "create the deleted relations again",
               _nodes("$request.body#/relations/*/from"),
               {"tool": "create_relations", "arguments": {"relations": "$before.body#/relations"}},
               version="/relations", touches=_ENDS),
    ],
    # A read tool's "read-only" is the server's word, not the database's: the reference PostgreSQL server's
    # `query` runs the text in a read-only transaction that a COMMIT inside the text ends. Every call of every
    # SQL tool is read, statement by statement, whatever the tool calls itself.
    "sqlite": [
        *({"tool": tool, "schemaDigest": _SQLITE[tool], "kind": "sql", "sql": "query"}
          for tool in ("read_query", "write_query", "create_table")),
        *({"tool": tool, "schemaDigest": _SQLITE[tool], "kind": "read_only"}
          for tool in ("list_tables", "describe_table")),
        {"tool": "append_insight", "schemaDigest": _SQLITE["append_insight"], "kind": "none",
         "reason": "It adds to the server's memo of insights, kept in its memory, which has no way to take "
                   "one back; the database is not touched.",
         "remedy": "The memo goes when the server restarts."},
    ],
    # DBHub cuts a text with a scanner of its own and sends each piece; it keeps its SQLite connection and
    # hands back pooled PostgreSQL clients, so a transaction one call leaves open holds the next.
    "dbhub": [{"tool": "execute_sql", "schemaDigest": _DBHUB_EXECUTE_SQL, "kind": "sql", "sql": "sql",
               "split": "dbhub", "keepsConnection": True}],
    "postgres": [{"tool": "query", "schemaDigest": _POSTGRES_QUERY, "kind": "sql", "sql": "sql"}],
    "git": [
        # The branch is read from git_status's text before the checkout; a detached HEAD has none, so such a
        # checkout is not undoable, and the step says why.
        {"tool": "git_checkout", "schemaDigest": _GIT["git_checkout"], "kind": "compensate",
         "does": "check out the branch that was checked out before",
         "read": {"tool": "git_status", "arguments": {"repo_path": "$request.body#/repo_path"}},
         "versionPattern": _ON_BRANCH,
         "compensation": {"tool": "git_checkout", "arguments": {
             "repo_path": "$request.body#/repo_path",
             "branch_name": {"$match": "$before.body", "pattern": _ON_BRANCH}}},
         "sideEffect": "Uncommitted changes go along to the branch checked out, or git refuses if they "
                       "would be overwritten."},
        {"tool": "git_add", "schemaDigest": _GIT["git_add"], "kind": "compensate",
         "does": "unstage the files again (git reset)",
         "read": {"tool": "git_diff_staged", "arguments": {"repo_path": "$request.body#/repo_path"}},
         "compensation": {"tool": "git_reset", "arguments": {"repo_path": "$request.body#/repo_path"}},
         "sideEffect": "git reset unstages everything that is staged, not only these files."},
        {"tool": "git_commit", "schemaDigest": _GIT["git_commit"], "kind": "none",
         "reason": "This server cannot undo a commit (it has no reset to an earlier commit).",
         "remedy": "Revert or reset the commit by hand (git revert; git reset --soft HEAD~1 if unpushed)."},
        {"tool": "git_create_branch", "schemaDigest": _GIT["git_create_branch"], "kind": "none",
         "reason": "This server cannot delete branches.",
         "remedy": "Delete the branch by hand (git branch -d NAME) if it should not exist."},
        {"tool": "git_reset", "schemaDigest": _GIT["git_reset"], "kind": "none",
         "reason": "What was staged before the reset is not kept, so it cannot be staged again.",
         "remedy": "Stage the files again by hand (git add)."},
    ],
}


def pack(name: str) -> list[dict[str, Any]]:
    """The recipes of pack `name` (raw, as an admin's would be); KeyError names the packs there are."""
    if name not in PACKS:
        raise KeyError(f"No recipe pack {name!r}: there are {', '.join(sorted(PACKS))}.")
    return copy.deepcopy(PACKS[name])  # an admin may edit what they get: the pack stays as shipped
