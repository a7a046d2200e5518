"""The sample servers keep the undo contract of docs/design.md, over real MCP: the later issues rely on it."""

from types import SimpleNamespace

import anyio
import pytest

from journal.upstream.client import Endpoint, Upstreams


def call(samples, server: str, tool: str, arguments: dict, meta: dict | None = None) -> dict:
    async def main():
        async with Upstreams(timeout=10) as upstreams:
            return await upstreams.call_tool(
                Endpoint(server, "http", samples.url(server)), tool, arguments, meta=meta
            )

    return anyio.run(main)


def journal(result: dict) -> dict:
    return result["_meta"]["hatp/journal"]


@pytest.fixture
def won(sample_servers):
    result = call(sample_servers, "crm", "update_deal", {"deal_id": "D-881", "stage": "Won"})
    return journal(result)


def test_update_deal_reports_the_change_with_a_signed_receipt(sample_servers, won):
    import rfc8785
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from journal.record.chain import b64url_decode

    # The deal's fields before and after the change travel with the effect, under the receipt.
    fields = {"amount": "48000", "owner": "dana", "close_date": "2026-12-15"}
    assert won["effect"] == {"summary": "Deal D-881 stage: Proposal → Won", "resource": "crm://acme/deal/D-881",
                             "version": "v13", "before": {"stage": "Proposal", **fields},
                             "after": {"stage": "Won", **fields}}
    assert won["undo"]["kind"] == "compensate" and won["undo"]["window"] == "P7D"
    crm = sample_servers.servers["crm"]
    body = {k: v for k, v in won.items() if k != "receipt"}
    Ed25519PublicKey.from_public_bytes(b64url_decode(crm.public_key)).verify(
        b64url_decode(won["receipt"]["signature"]), rfc8785.dumps(body))


def test_check_changes_nothing_and_compensate_restores(sample_servers, won):
    token = won["compensationToken"]
    check = call(sample_servers, "crm", "hatp_check", {"compensationToken": token, "ifVersion": "v13"})
    assert check["isError"] is False and check["structuredContent"]["ok"] is True
    assert [e["op"] for e in sample_servers.ledger("crm")] == ["update_deal"]
    done = call(sample_servers, "crm", "hatp_compensate",
                {"compensationToken": token, "ifVersion": "v13", "idempotencyKey": "plan-1-item-1"})
    assert done["structuredContent"]["restored"] == {"stage": "Proposal"}
    assert done["structuredContent"]["summary"] == "Deal D-881 stage: Won → Proposal"
    deal = call(sample_servers, "crm", "get_deal", {"deal_id": "D-881"})["structuredContent"]
    assert deal["stage"] == "Proposal" and deal["version"] == "v14"


def test_a_replayed_idempotency_key_returns_the_first_outcome_and_changes_nothing(sample_servers, won):
    arguments = {"compensationToken": won["compensationToken"], "ifVersion": "v13", "idempotencyKey": "k-1"}
    first = call(sample_servers, "crm", "hatp_compensate", arguments)
    second = call(sample_servers, "crm", "hatp_compensate", arguments)
    assert first["structuredContent"] == second["structuredContent"]
    assert [e["op"] for e in sample_servers.ledger("crm")].count("compensate") == 1


def test_a_colleagues_edit_is_a_conflict_naming_who_and_what(sample_servers, won):
    sample_servers.colleague_update("D-881", {"stage": "Negotiation"}, by="priya")
    conflict = call(sample_servers, "crm", "hatp_check", {"compensationToken": won["compensationToken"],
                                                          "ifVersion": "v13"})
    assert conflict["isError"] is True
    structured = conflict["structuredContent"]
    assert structured["code"] == "UNDO_CONFLICT"
    assert structured["current"]["version"] == "v14" and structured["current"]["changedBy"] == "priya"
    assert structured["current"]["summary"] == "Deal D-881 stage: Won → Negotiation"
    assert structured["current"]["fields"] == {"stage": "Negotiation", "amount": "48000", "owner": "dana",
                                               "close_date": "2026-12-15"}
    refused = call(sample_servers, "crm", "hatp_compensate", {"compensationToken": won["compensationToken"],
                                                              "ifVersion": "v13", "idempotencyKey": "k"})
    assert refused["structuredContent"]["code"] == "UNDO_CONFLICT"
    assert "compensate" not in [e["op"] for e in sample_servers.ledger("crm")]


def test_unknown_tokens_and_closed_windows(sample_servers, won):
    unknown = call(sample_servers, "crm", "hatp_check", {"compensationToken": "ctk_nope"})
    assert unknown["structuredContent"]["code"] == "UNDO_UNKNOWN_TOKEN"
    crm = sample_servers.servers["crm"]
    crm.store.data["tokens"][won["compensationToken"]]["undoBy"] = "2020-01-01T00:00:00Z"
    expired = call(sample_servers, "crm", "hatp_check", {"compensationToken": won["compensationToken"]})
    assert expired["structuredContent"]["code"] == "UNDO_EXPIRED"


def test_cancelling_the_kickoff_sends_the_attendees_notices(sample_servers):
    booked = call(sample_servers, "calendar", "create_event", {
        "title": "Kickoff with Globex", "start": "2026-12-04T15:00:00+00:00",
        "attendees": ["dana@acme.example", "buyer@globex.example"]})
    assert journal(booked)["undo"]["sideEffect"] == "attendees get a cancellation notice"
    assert journal(booked)["undo"]["window"] == "P30D"
    done = call(
        sample_servers,
        "calendar",
        "hatp_compensate",
        {"compensationToken": journal(booked)["compensationToken"]},
    )
    assert "Cancel 'Kickoff with Globex' on Dec 4" in done["content"][0]["text"]
    cancel = [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"][0]
    assert [n["to"] for n in cancel["notices"]] == ["dana@acme.example", "buyer@globex.example"]


def test_mail_says_it_cannot_be_undone_and_what_to_do(sample_servers):
    sent = call(
        sample_servers, "mail", "send_email", {"to": "buyer@globex.example", "subject": "Hi", "body": "x"}
    )
    assert journal(sent)["undo"] == {"kind": "none", "reason": "delivered to external recipients",
                                     "remedy": "send a correction email"}
    assert "compensationToken" not in journal(sent)


def test_payments_refund_by_transaction_id_honours_the_idempotency_key(sample_servers):
    charge = call(sample_servers, "payments", "charge_payment", {"customer": "globex", "amount": "2500.00"})
    transaction = charge["structuredContent"]["transactionId"]
    meta = {"hatp/journal": {"ifVersion": None, "idempotencyKey": "refund-1"}}
    first = call(sample_servers, "payments", "refund_payment", {"transactionId": transaction}, meta=meta)
    again = call(sample_servers, "payments", "refund_payment", {"transactionId": transaction}, meta=meta)
    assert first == again and first["isError"] is False
    assert [e["op"] for e in sample_servers.ledger("payments")] == ["charge", "refund"]


def test_inventory_release_undoes_a_reservation(sample_servers):
    hold = call(sample_servers, "inventory", "reserve_inventory", {"sku": "SKU-GLOBEX-KIT", "quantity": 5})
    assert (
        call(sample_servers, "inventory", "check_stock", {"sku": "SKU-GLOBEX-KIT"})["structuredContent"][
            "free"
        ]
        == 35
    )
    call(sample_servers, "inventory", "release_inventory", {"id": hold["structuredContent"]["id"]})
    assert (
        call(sample_servers, "inventory", "check_stock", {"sku": "SKU-GLOBEX-KIT"})["structuredContent"][
            "free"
        ]
        == 40
    )


def test_state_survives_a_restart(tmp_path):
    from samples.servers import Crm

    first = Crm(tmp_path)
    anyio.run(first.update_deal, {"deal_id": "D-881", "stage": "Won"})
    again = Crm(tmp_path)
    assert again.records["deal/D-881"]["stage"] == "Won" and again.public_key == first.public_key


def test_an_answer_held_after_the_call_acted_keeps_the_change(sample_servers):
    """The fault tests' window: the server has acted and the caller, gone before the answer, never hears."""
    sample_servers.set_mode("inventory", "normal", answer_delay_ms=2000)

    async def main():
        with anyio.move_on_after(0.5):  # the caller gives up long before the answer
            async with Upstreams(timeout=10) as upstreams:
                await upstreams.call_tool(Endpoint("inventory", "http", sample_servers.url("inventory")),
                                          "reserve_inventory", {"sku": "SKU-GLOBEX-KIT", "quantity": 5})
            raise AssertionError("the answer came before its delay")

    anyio.run(main)
    sample_servers.set_mode("inventory", "normal")
    assert [e["op"] for e in sample_servers.ledger("inventory")] == ["reserve"]
    stock = call(sample_servers, "inventory", "check_stock", {"sku": "SKU-GLOBEX-KIT"})["structuredContent"]
    assert stock["free"] == 35


def test_several_sample_processes_check_a_token_signed_by_one_with_the_delay_they_were_started_with(tmp_path):
    """`python -m samples --workers N --delay-ms D` (the checks benchmark's tool server on cores of its own):
    every process reads the state and the keys one process wrote, and waits D before each call."""
    import subprocess
    import sys
    import time

    import httpx

    from tests.conftest import free_port

    def started(*extra):
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "samples", "--port", str(port), "--state",
                                    str(tmp_path), *extra])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/crm/ledger", timeout=1)
                return process, SimpleNamespace(url=lambda name: f"http://127.0.0.1:{port}/{name}/mcp")
            except httpx.HTTPError:
                time.sleep(0.1)
        process.kill()
        raise AssertionError("the sample servers did not start")

    one, samples = started()
    try:
        token = journal(call(samples, "crm", "update_deal", {"deal_id": "D-881", "stage": "Won"}))[
            "compensationToken"]
    finally:
        one.terminate()
        one.wait(timeout=20)
    several, samples = started("--workers", "2", "--delay-ms", "150")
    try:
        for _ in range(4):  # whichever process answers
            began = time.monotonic()
            check = call(samples, "crm", "hatp_check", {"compensationToken": token, "ifVersion": "v13"})
            assert check["structuredContent"]["ok"] is True, check
            assert time.monotonic() - began >= 0.15
    finally:
        several.terminate()
        several.wait(timeout=20)
