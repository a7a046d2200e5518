"""Shapes between protocol versions, as pure functions (journal.mcp.versions)."""

import pytest

from journal.mcp import versions

SERVER_INFO = "io.modelcontextprotocol/serverInfo"


def test_a_2026_client_reads_an_older_servers_result_as_complete():
    result = {"content": [{"type": "text", "text": "hi"}]}
    assert versions.for_client(result, version="2026-07-28") == {**result, "resultType": "complete"}
    assert "resultType" not in result  # the server's answer itself is left as it was


def test_an_older_client_never_sees_result_type():
    result = {"content": [], "resultType": "complete"}
    for version in ("2025-11-25", "2025-06-18", "2025-03-26"):
        assert versions.for_client(result, version=version) == {"content": []}


def test_an_answer_an_older_client_cannot_carry_is_untranslatable():
    with pytest.raises(versions.Untranslatable, match="'input_required' result, which protocol 2025-11-25"):
        versions.for_client({"resultType": "input_required", "requestState": "x"}, version="2025-11-25")
    kept = {"resultType": "input_required", "requestState": "x"}
    assert versions.for_client(kept, version="2026-07-28") == kept


def test_the_servers_own_envelope_never_crosses_the_hop_and_nothing_else_is_touched():
    result = {"content": [], "_meta": {SERVER_INFO: {"name": "crm"}, "hatp/journal": {"effect": {}}}}
    assert versions.from_server(result) == {"content": [], "_meta": {"hatp/journal": {"effect": {}}}}
    assert versions.from_server({"content": [], "_meta": {SERVER_INFO: {"name": "crm"}}}) == {"content": []}
    odd = {"content": [], "_meta": "not an object"}  # a server's own mistake is relayed as it is
    assert versions.from_server(odd) == odd
