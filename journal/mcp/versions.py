"""Between protocol versions, as pure functions: what a server's answer looks like to a client that speaks
another version, and which parts of a message belong to one hop only.

The Recorder terminates MCP on both sides, so an agent on the stateless 2026-07-28 protocol may reach a
server that only speaks the 2025 handshake, and the other way round. Their results differ in shape only
where the schemas do: 2026-07-28 results carry `resultType` (which a 2025 client does not know, and which a
2026 client must read as "complete" when an older server leaves it out), and each 2026 hop stamps its own
`_meta["io.modelcontextprotocol/…"]` envelope (the sender's serverInfo), which never crosses a hop.
Everything else passes through as the server sent it.
"""

from collections.abc import Mapping
from typing import Any

from mcp_types.version import MODERN_PROTOCOL_VERSIONS

ENVELOPE_PREFIX = "io.modelcontextprotocol/"
COMPLETE = "complete"
INPUT_REQUIRED = "input_required"
MODERN = MODERN_PROTOCOL_VERSIONS


class Untranslatable(ValueError):
    """A result that a client on the given version has no way to read (`message` says why)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def without_envelope(meta: Any) -> dict[str, Any] | None:
    """A `_meta` without the keys one hop writes for itself (the protocol envelope); None if nothing is
    left."""
    if not isinstance(meta, Mapping):
        return None
    kept = {k: v for k, v in meta.items() if not (isinstance(k, str) and k.startswith(ENVELOPE_PREFIX))}
    return kept or None


def from_server(result: Mapping[str, Any]) -> dict[str, Any]:
    """A server's result as the Recorder relays and journals it: exactly what the server sent, minus the
    server's own hop envelope in `_meta` (the Recorder stamps its own, on the versions that have one)."""
    relayed = dict(result)
    if isinstance(
        relayed.get("_meta"), Mapping
    ):  # anything else is the server's own mistake, relayed as sent
        meta = without_envelope(relayed["_meta"])
        if meta is None:
            del relayed["_meta"]
        else:
            relayed["_meta"] = meta
    return relayed


def for_client(result: Mapping[str, Any], *, version: str) -> dict[str, Any]:
    """`result` as a client on `version` reads it: a 2026-07-28 client gets `resultType` ("complete" when an
    older server left it out, as that version's spec says to read it); an older client does not get it. An
    answer an older client cannot express (a 2026 `input_required` result) raises Untranslatable."""
    shaped = dict(result)
    result_type = shaped.get("resultType")
    if version in MODERN_PROTOCOL_VERSIONS:
        if result_type is None:
            shaped["resultType"] = COMPLETE
        return shaped
    if result_type not in (None, COMPLETE):
        raise Untranslatable(f"the server answered with a {result_type!r} result, which protocol {version} "
                             "cannot carry")
    shaped.pop("resultType", None)
    return shaped
