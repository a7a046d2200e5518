"""The HATP journal dialect on the server side: per-call `_meta`, signed receipts, `hatp_check` and
`hatp_compensate` with `ifVersion`, `idempotencyKey` and the UNDO_* error codes (docs/design.md)."""

import base64
import secrets
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import mcp_types as types
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .base import SampleServer, now, rfc3339, text_result, tool_error

TOKEN_ARGS = {
    "type": "object",
    "properties": {
        "compensationToken": {"type": "string"},
        "ifVersion": {"type": "string"},
        "idempotencyKey": {"type": "string"},
    },
    "required": ["compensationToken"],
}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class HatpServer(SampleServer):
    """A HATP server keeps `records` (each with a version and who changed it last) and `tokens` (what each
    change would take back). Subclasses say how to apply and revert a change."""

    window = timedelta(days=7)

    def __init__(self, state_dir: Path | None):
        super().__init__(state_dir)
        self.key = self._load_key(state_dir)
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = f"{self.name}-{b64url(raw)[:8]}"
        self.public_key = b64url(raw)

    def _load_key(self, state_dir: Path | None) -> Ed25519PrivateKey:
        if state_dir is None:
            return Ed25519PrivateKey.generate()
        path = state_dir / f"{self.name}.key"
        if path.exists():
            return Ed25519PrivateKey.from_private_bytes(base64.b64decode(path.read_text()))
        key = Ed25519PrivateKey.generate()
        raw = key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.b64encode(raw).decode())
        path.chmod(0o600)
        return key

    def initial_state(self) -> dict[str, Any]:
        return {"ledger": [], "records": {}, "tokens": {}, "idempotency": {}}

    @property
    def records(self) -> dict[str, Any]:
        return self.store.data["records"]

    def journal_tool_meta(self, undo: dict[str, Any]) -> dict[str, Any]:
        return {"hatp/journal": {"undo": undo, "receiptKeys": [
            {"keyId": self.key_id, "alg": "Ed25519", "publicKey": self.public_key}
        ]}}

    def hatp_tools(self) -> list[dict[str, Any]]:
        return [
            {"name": "hatp_check", "description": "Would this undo work now? Changes nothing.",
             "inputSchema": TOKEN_ARGS, "annotations": {"readOnlyHint": True}},
            {"name": "hatp_compensate", "description": "Undo a change by its compensation token.",
             "inputSchema": TOKEN_ARGS},
        ]

    def sign(self, journal: dict[str, Any]) -> dict[str, Any]:
        signature = self.key.sign(rfc8785.dumps(journal))
        return {
            **journal,
            "receipt": {"keyId": self.key_id, "alg": "Ed25519", "signature": b64url(signature)},
        }

    def issue_token(self, *, resource_id: str, undo: dict[str, Any], revert: dict[str, Any], summary: str,
                    version: str, fields: tuple[dict, dict] | None = None) -> dict[str, Any]:
        """Record what this change would take back and return the call's signed journal `_meta`; `fields`:
        the record's field values before and after the change, sent as the effect's `before` and `after`
        (under the receipt, like the rest of the effect)."""
        token = "ctk_" + secrets.token_urlsafe(16)
        undo_by = now() + self.window
        self.store.data["tokens"][token] = {
            "resource": resource_id, "revert": revert, "version": version, "summary": summary,
            "undoBy": rfc3339(undo_by), "compensated": False,
        }
        journal = {
            "undo": {**undo, "undoBy": rfc3339(undo_by)},
            "compensationToken": token,
            "effect": {"summary": summary, "resource": self.resource_uri(resource_id), "version": version,
                       **({"before": fields[0], "after": fields[1]} if fields is not None else {})},
        }
        return {"hatp/journal": self.sign(journal)}

    def resource_uri(self, resource_id: str) -> str:
        return f"{self.name}://acme/{resource_id}"

    # -- the undo contract ------------------------------------------------------------------------------

    def _problem(self, arguments: dict[str, Any]) -> types.CallToolResult | None:
        token = self.store.data["tokens"].get(arguments.get("compensationToken", ""))
        if token is None:
            return tool_error("No change is known by this compensation token.", code="UNDO_UNKNOWN_TOKEN")
        if token["compensated"]:
            return tool_error(
                "This change was already undone.", code="UNDO_FAILED", reason="already compensated"
            )
        if now() > datetime.fromisoformat(token["undoBy"]):
            return tool_error(f"The undo window closed at {token['undoBy']}.", code="UNDO_EXPIRED",
                              undoBy=token["undoBy"])
        record = self.records.get(token["resource"])
        if record is None:
            return tool_error("The record no longer exists.", code="UNDO_FAILED")
        expected = arguments.get("ifVersion") or token["version"]
        if record["version"] != expected:
            return tool_error(
                f"{token['resource']} changed since: it is at {record['version']}, not {expected}.",
                code="UNDO_CONFLICT",
                current={"version": record["version"], "summary": record.get("lastSummary", ""),
                         "changedBy": record.get("changedBy", ""), "changedAt": record.get("changedAt", ""),
                         **({"fields": shown} if (shown := self.field_values(record)) is not None else {})},
            )
        return None

    async def hatp_check(self, arguments: dict[str, Any]) -> types.CallToolResult:
        problem = self._problem(arguments)
        if problem is not None:
            return problem
        token = self.store.data["tokens"][arguments["compensationToken"]]
        return text_result(
            f"Undo would work now: {self.describe_undo(token)}.",
            structured={"ok": True, "wouldDo": self.describe_undo(token), "undoBy": token["undoBy"]},
        )

    async def hatp_compensate(self, arguments: dict[str, Any]) -> types.CallToolResult:
        return self.once(arguments.get("idempotencyKey"), lambda: self._compensate(arguments))

    def _compensate(self, arguments: dict[str, Any]) -> types.CallToolResult:
        problem = self._problem(arguments)
        if problem is not None:
            return problem
        token_id = arguments["compensationToken"]
        token = self.store.data["tokens"][token_id]
        record = self.records[token["resource"]]
        summary = self.describe_undo(token)  # in the words of the record before it changes back
        notes = self.revert(token["resource"], record, token["revert"])
        record["version"] = self.next_version(record["version"])
        record.update(changedBy="undo", changedAt=rfc3339(now()), lastSummary=summary)
        token["compensated"] = True
        self.store.record(
            {
                "op": "compensate",
                "token": token_id,
                "resource": token["resource"],
                "idempotencyKey": arguments.get("idempotencyKey"),
                "version": record["version"],
                **notes,
            }
        )
        return text_result(f"Undone: {summary}.", structured={
            "ok": True, "summary": summary, "version": record["version"], **notes})

    def field_values(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The record's field values as an UNDO_CONFLICT's `current.fields` shows them (None: not sent)."""
        return None

    @staticmethod
    def next_version(version: str) -> str:
        return f"v{int(version.lstrip('v')) + 1}"

    def describe_undo(self, token: dict[str, Any]) -> str:
        raise NotImplementedError

    def revert(self, resource_id: str, record: dict[str, Any], revert: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError
