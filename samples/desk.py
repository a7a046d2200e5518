"""`desk`: a small customer desk that a computer-use agent drives through its screens (the HATP draft's
`via: "ui"`). Its records can be edited, sent to the trash and restored from it; the app itself offers the
way back, so the server keeps, behind each compensation token, the procedure that takes a change back through
the app's screens and replays it on `hatp_compensate`.

A change's version is a **state fingerprint** of the changed record only: the screen it shows on and its
visible fields, hashed (never the whole screen). `hatp_check` compares fingerprints (`UNDO_CONFLICT` with
what changed when they differ) and, once the procedure was replayed, answers whether the record shows its
earlier state again (`"status": "undone"`), the postcondition the executor asks about. The control mode
"replay_noop" makes a replay click through without effect, as a UI that silently did not take the click.
"""

import hashlib
from datetime import timedelta
from typing import Any

import mcp_types as types
import rfc8785
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .base import now, rfc3339, text_result, tool_error
from .hatp import TOKEN_ARGS, HatpServer

VISIBLE = ("title", "status", "owner")


def screen_of(record: dict[str, Any]) -> str:
    return f"{'Trash' if record['trashed'] else 'Records'} › {record['id']}"


def fingerprint_fields(record: dict[str, Any]) -> dict[str, Any]:
    """What the record shows: the screen it is on and its visible fields."""
    return {"screen": screen_of(record), "fields": {name: record[name] for name in VISIBLE}}


def fingerprint(record: dict[str, Any]) -> str:
    return "fp:" + hashlib.sha256(rfc8785.dumps(fingerprint_fields(record))).hexdigest()[:16]


class Desk(HatpServer):
    name = "desk"
    window = timedelta(days=7)
    undo = {"kind": "compensate", "window": "P7D", "via": "ui"}

    def initial_state(self) -> dict[str, Any]:
        state = super().initial_state()
        state["records"] = {
            "record/C-77": {
                "id": "C-77",
                "title": "Globex",
                "status": "Prospect",
                "owner": "dana",
                "trashed": False,
                "changedBy": "dana",
                "changedAt": "2026-11-20T10:00:00Z",
            },
            "record/C-78": {
                "id": "C-78",
                "title": "Initech",
                "status": "Customer",
                "owner": "dana",
                "trashed": False,
                "changedBy": "dana",
                "changedAt": "2026-11-18T09:00:00Z",
            },
        }
        return state

    def tools(self) -> list[dict[str, Any]]:
        record_id = {"id": {"type": "string"}}
        return [
            {
                "name": "open_record",
                "description": "Open a record's screen and read it.",
                "annotations": {"readOnlyHint": True},
                "inputSchema": {"type": "object", "properties": record_id, "required": ["id"]},
            },
            {
                "name": "edit_record",
                "description": "Edit a record's title, status or owner on its screen.",
                "inputSchema": {
                    "type": "object",
                    "properties": {**record_id, **{f: {"type": "string"} for f in VISIBLE}},
                    "required": ["id"],
                },
                "_meta": self.journal_tool_meta(self.undo),
            },
            {
                "name": "trash_record",
                "description": "Send a record to the trash (it can be restored from there).",
                "inputSchema": {"type": "object", "properties": record_id, "required": ["id"]},
                "_meta": self.journal_tool_meta(self.undo),
            },
            {
                "name": "hatp_check",
                "description": "Would this undo work now, or has it happened? Changes nothing.",
                "inputSchema": TOKEN_ARGS,
                "annotations": {"readOnlyHint": True},
            },
            {
                "name": "hatp_compensate",
                "description": "Replay the app's own way back for a change.",
                "inputSchema": TOKEN_ARGS,
            },
        ]

    def handlers(self):
        return {
            "open_record": self.open_record,
            "edit_record": self.edit_record,
            "trash_record": self.trash_record,
            "hatp_check": self.hatp_check,
            "hatp_compensate": self.hatp_compensate,
        }

    def _record(self, record_id: str) -> dict[str, Any] | None:
        return self.records.get(f"record/{record_id}")

    async def open_record(self, arguments):
        record = self._record(str(arguments["id"]))
        if record is None:
            return tool_error(f"No record {arguments['id']}.", code="NOT_FOUND")
        return text_result(f"{screen_of(record)}: {record['title']}, {record['status']}",
                           structured={**fingerprint_fields(record), "fingerprint": fingerprint(record)})

    async def edit_record(self, arguments):
        record = self._record(str(arguments["id"]))
        if record is None or record["trashed"]:
            return tool_error(f"No record {arguments['id']} on the records screen.", code="NOT_FOUND")
        changes = {f: str(arguments[f]) for f in VISIBLE if f in arguments and str(arguments[f]) != record[f]}
        if not changes:
            return tool_error(
                "Nothing to change: the record already shows these values.", code="BUSINESS_RULE"
            )
        before = {f: record[f] for f in changes}
        summary = f"{record['id']} " + "; ".join(f"{f}: {before[f]} → {v}" for f, v in changes.items())
        # Its undo, as the change it makes: back from what the agent left to what was there before.
        undone = f"{record['id']} " + "; ".join(f"{f}: {v} → {before[f]}" for f, v in changes.items())
        procedure = [{"screen": screen_of(record), "do": "edit", "set": before}]
        return self._changed(record, changes, summary, procedure, undone)

    async def trash_record(self, arguments):
        record = self._record(str(arguments["id"]))
        if record is None or record["trashed"]:
            return tool_error(f"No record {arguments['id']} on the records screen.", code="NOT_FOUND")
        summary = f"{record['id']} ({record['title']}) moved to the trash"
        procedure = [
            {"screen": "Trash", "do": "select", "record": record["id"]},
            {"do": "click", "button": "Restore"},
        ]
        undone = f"{record['id']} ({record['title']}) restored from the trash"
        return self._changed(record, {"trashed": True}, summary, procedure, undone)

    def _changed(
        self, record, changes: dict[str, Any], summary: str, procedure: list, undone: str
    ) -> types.CallToolResult:
        """Apply a change made through the screens, and keep its way back behind a compensation token."""
        earlier = fingerprint_fields(record)
        record.update(changes, changedBy="agent", changedAt=rfc3339(now()))
        shown, version = fingerprint_fields(record), fingerprint(record)
        meta = self.issue_token(
            resource_id=f"record/{record['id']}", undo=self.undo, revert={}, summary=summary, version=version
        )
        token = self.store.data["tokens"][meta["hatp/journal"]["compensationToken"]]
        token.update(procedure=procedure, earlier=earlier, undone=undone)
        # The fingerprint's inputs go with the call, so a person sees what it covers (and the receipt signs
        # them).
        journal = {key: value for key, value in meta["hatp/journal"].items() if key != "receipt"}
        journal["effect"] = {**journal["effect"], "fingerprint": shown}
        self.store.record(
            {"op": "change", "record": record["id"], "changes": changes, "fingerprint": version}
        )
        self.store.save()
        return text_result(summary, structured={"record": shown, "fingerprint": version},
                           meta={"hatp/journal": self.sign(journal)})

    # -- the undo contract, through the screens ----------------------------------------------------------

    def _undo_problem(
        self, token: dict[str, Any] | None, arguments: dict[str, Any]
    ) -> types.CallToolResult | None:
        if token is None:
            return tool_error("No change is known by this compensation token.", code="UNDO_UNKNOWN_TOKEN")
        if now().isoformat() > token["undoBy"].replace("Z", "+00:00"):
            return tool_error(f"The undo window closed at {token['undoBy']}.", code="UNDO_EXPIRED")
        record = self.records[token["resource"]]
        expected = arguments.get("ifVersion") or token["version"]
        if fingerprint(record) != expected:
            shown = fingerprint_fields(record)
            return tool_error(
                f"{record['id']} shows something else now ({shown['screen']}: "
                + ", ".join(f"{k} {v}" for k, v in shown["fields"].items())
                + ").",
                code="UNDO_CONFLICT",
                current={
                    "version": fingerprint(record),
                    "summary": record.get("lastSummary", ""),
                    "changedBy": record["changedBy"],
                    "changedAt": record["changedAt"],
                },
            )
        return None

    async def hatp_check(self, arguments: dict[str, Any]) -> types.CallToolResult:
        token = self.store.data["tokens"].get(arguments.get("compensationToken", ""))
        if token is not None and token["compensated"]:
            record = self.records[token["resource"]]
            if (
                fingerprint_fields(record) == token["earlier"]
            ):  # the postcondition: the earlier state shows again
                return text_result(f"Undone: {record['id']} shows its earlier state.",
                                   structured={"status": "undone", "summary": token["summary"],
                                               "shows": fingerprint_fields(record)})
            return tool_error(f"The undo was replayed, but {record['id']} does not show its earlier state.",
                              code="UNDO_CONFLICT", current={"version": fingerprint(record), "summary": "",
                                                             "changedBy": record["changedBy"],
                                                             "changedAt": record["changedAt"]})
        problem = self._undo_problem(token, arguments)
        if problem is not None:
            return problem
        would = self.describe_undo(token)
        return text_result(
            f"Undo would work now: {would}.",
            structured={"status": "ok", "would": would, "wouldDo": would, "undoBy": token["undoBy"]},
        )

    def _compensate(self, arguments: dict[str, Any]) -> types.CallToolResult:
        token = self.store.data["tokens"].get(arguments.get("compensationToken", ""))
        if token is not None and token["compensated"]:
            return tool_error(
                "This change was already undone.", code="UNDO_FAILED", reason="already compensated"
            )
        problem = self._undo_problem(token, arguments)
        if problem is not None:
            return problem
        record = self.records[token["resource"]]
        if self.mode != "replay_noop":  # the app takes the clicks
            for step in token["procedure"]:
                if step["do"] == "edit":
                    record.update(step["set"])
                elif step["do"] == "click" and step["button"] == "Restore":
                    record["trashed"] = False
        record.update(changedBy="undo", changedAt=rfc3339(now()), lastSummary=f"Put back: {token['undone']}")
        token["compensated"] = True
        self.store.record(
            {
                "op": "compensate",
                "token": arguments["compensationToken"],
                "record": record["id"],
                "procedure": token["procedure"],
                "idempotencyKey": arguments.get("idempotencyKey"),
            }
        )
        return text_result(f"Replayed the way back for {record['id']} on its screens.", structured={
            "ok": True, "summary": f"Put back through the app's screens: {token['undone']}",
            "version": fingerprint(record)})

    def describe_undo(self, token: dict[str, Any]) -> str:
        steps = " → ".join(
            f"{s.get('screen', '')} {s['do']}".strip() + (f" {s['button']}" if "button" in s else "")
            for s in token["procedure"])
        return f"Put back {token['undone']} through the app's screens ({steps})"

    def colleague_routes(self):
        return [Route("/colleague/edit_record", self.colleague_edit, methods=["POST"])]

    async def colleague_edit(self, request: Request) -> JSONResponse:
        """A person edits a record on the desk's own screens: never exposed through the Recorder."""
        body = await request.json()
        async with self.store.lock:
            record = self._record(str(body.get("id", "")))
            if record is None:
                return JSONResponse({"error": "no such record"}, status_code=404)
            changes = {f: str(v) for f, v in (body.get("changes") or {}).items() if f in VISIBLE}
            record.update(changes, changedBy=str(body.get("by", "a colleague")), changedAt=rfc3339(now()),
                          lastSummary=f"{record['id']} edited on its screen")
            self.store.record({"op": "colleague_edit", "record": record["id"], "changes": changes})
            self.store.save()
        return JSONResponse({"record": fingerprint_fields(record), "fingerprint": fingerprint(record)})
