"""Databases as a source of undo: what an agent's SQL would do, read by the database's own grammar before it
is sent (`reading`, `postgres`, `sqlite`), and what that means for its undo (`judging`)."""
