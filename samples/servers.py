"""The sample tool servers of the Globex story."""

import secrets
from datetime import datetime, timedelta
from typing import Any

import mcp_types as types
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .base import SampleServer, now, rfc3339, text_result, tool_error
from .desk import Desk
from .hatp import HatpServer

ARROW = "→"


class Crm(HatpServer):
    name = "crm"
    window = timedelta(days=7)
    fields = ("stage", "amount", "owner", "close_date")

    def initial_state(self) -> dict[str, Any]:
        state = super().initial_state()
        state["records"] = {
            "deal/D-881": {"id": "D-881", "name": "Globex renewal", "stage": "Proposal", "amount": "48000",
                           "owner": "dana", "close_date": "2026-12-15", "version": "v12",
                           "changedBy": "dana", "changedAt": "2026-11-20T10:00:00Z", "lastSummary": ""},
            "deal/D-882": {"id": "D-882", "name": "Initech expansion", "stage": "Qualification",
                           "amount": "12000", "owner": "dana", "close_date": "2027-01-31", "version": "v3",
                           "changedBy": "dana", "changedAt": "2026-11-18T09:00:00Z", "lastSummary": ""},
        }
        return state

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "get_deal",
                "description": "Read a deal.",
                "annotations": {"readOnlyHint": True},
                "inputSchema": {
                    "type": "object",
                    "properties": {"deal_id": {"type": "string"}},
                    "required": ["deal_id"],
                },
            },
            {
                "name": "update_deal",
                "description": "Change a deal's stage, amount, owner or close date.",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "deal_id": {"type": "string"},
                        **{f: {"type": "string"} for f in self.fields},
                    },
                    "required": ["deal_id"],
                },
                "_meta": self.journal_tool_meta({"kind": "compensate", "window": "P7D", "via": "api"}),
            },
            *self.hatp_tools(),
        ]

    def handlers(self):
        return {"get_deal": self.get_deal, "update_deal": self.update_deal,
                "hatp_check": self.hatp_check, "hatp_compensate": self.hatp_compensate}

    def _deal(self, deal_id: str) -> dict[str, Any] | None:
        return self.records.get(f"deal/{deal_id}")

    async def get_deal(self, arguments):
        deal = self._deal(arguments["deal_id"])
        if deal is None:
            return tool_error(f"Deal {arguments['deal_id']} not found.", code="NOT_FOUND")
        return text_result(f"Deal {deal['id']}: {deal['name']}, {deal['stage']}", structured=dict(deal))

    @staticmethod
    def _summary(deal_id: str, before: dict[str, Any], after: dict[str, Any]) -> str:
        parts = [f"{field.replace('_', ' ')}: {before[field]} {ARROW} {after[field]}" for field in after]
        return f"Deal {deal_id} " + "; ".join(parts)

    def _apply(self, deal: dict[str, Any], changes: dict[str, str], by: str) -> tuple[dict, str]:
        before = {field: deal[field] for field in changes}
        deal.update(changes)
        deal["version"] = self.next_version(deal["version"])
        summary = self._summary(deal["id"], before, changes)
        deal.update(changedBy=by, changedAt=rfc3339(now()), lastSummary=summary)
        return before, summary

    async def update_deal(self, arguments):
        deal = self._deal(arguments["deal_id"])
        if deal is None:
            return tool_error(f"Deal {arguments['deal_id']} not found.", code="NOT_FOUND")
        changes = {
            f: str(arguments[f]) for f in self.fields if f in arguments and str(arguments[f]) != deal[f]
        }
        if not changes:
            return tool_error("Nothing to change: the deal already has these values.", code="BUSINESS_RULE")
        earlier = self.field_values(deal)
        before, summary = self._apply(deal, changes, by="agent")
        meta = self.issue_token(resource_id=f"deal/{deal['id']}", undo={"kind": "compensate", "window": "P7D",
                                "via": "api"}, revert=before, summary=summary, version=deal["version"],
                                fields=(earlier, self.field_values(deal)))
        self.store.record(
            {"op": "update_deal", "deal": deal["id"], "changes": changes, "version": deal["version"]}
        )
        self.store.save()
        return text_result(summary, structured={"deal": dict(deal)}, meta=meta)

    def field_values(self, record):
        # Every field a deal's change can touch, before and after, so a colleague's later change to another
        # of them shows beside the agent's.
        return {field: record[field] for field in self.fields}

    def describe_undo(self, token):
        deal = self.records[token["resource"]]
        return self._summary(deal["id"], {f: deal[f] for f in token["revert"]}, token["revert"])

    def revert(self, resource_id, record, revert):
        record.update(revert)
        return {"restored": revert}

    def colleague_routes(self):
        return [Route("/colleague/update_deal", self.colleague_update, methods=["POST"])]

    async def colleague_update(self, request: Request) -> JSONResponse:
        """A second way in, as a colleague in the CRM's own UI: never exposed through the Recorder."""
        body = await request.json()
        async with self.store.lock:
            deal = self._deal(str(body.get("deal_id", "")))
            if deal is None:
                return JSONResponse({"error": "no such deal"}, status_code=404)
            changes = {f: str(v) for f, v in (body.get("changes") or {}).items() if f in self.fields}
            if not changes:
                return JSONResponse({"error": "nothing to change"}, status_code=400)
            by = str(body.get("by", "a colleague"))
            _, summary = self._apply(deal, changes, by=by)
            self.store.record({"op": "colleague_update", "deal": deal["id"], "changes": changes, "by": by,
                               "version": deal["version"]})
            self.store.save()
        return JSONResponse({"deal": deal, "summary": summary})


class Calendar(HatpServer):
    name = "calendar"
    window = timedelta(days=30)
    side_effect = "attendees get a cancellation notice"

    def tools(self):
        return [
            {
                "name": "create_event",
                "description": "Book a meeting and invite the attendees.",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "start": {"type": "string", "format": "date-time"},
                        "attendees": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["title", "start", "attendees"],
                },
                "_meta": self.journal_tool_meta(
                    {"kind": "compensate", "window": "P30D", "via": "api", "sideEffect": self.side_effect}
                ),
            },
            {
                "name": "list_events",
                "description": "List booked events.",
                "annotations": {"readOnlyHint": True},
                "inputSchema": {"type": "object", "properties": {}},
            },
            *self.hatp_tools(),
        ]

    def handlers(self):
        return {"create_event": self.create_event, "list_events": self.list_events,
                "hatp_check": self.hatp_check, "hatp_compensate": self.hatp_compensate}

    @staticmethod
    def _when(start: str) -> str:
        moment = datetime.fromisoformat(start)
        return f"{moment:%b} {moment.day}"

    async def create_event(self, arguments):
        title, start = str(arguments["title"]), str(arguments["start"])
        attendees = [str(a) for a in arguments["attendees"]]
        when = self._when(start)
        event_id = "E-" + secrets.token_hex(3).upper()
        self.records[f"event/{event_id}"] = {
            "id": event_id,
            "title": title,
            "start": start,
            "attendees": attendees,
            "status": "booked",
            "version": "v1",
            "changedBy": "agent",
            "changedAt": rfc3339(now()),
            "lastSummary": "",
        }
        summary = f"Booked '{title}' on {when} with {len(attendees)} attendees"
        meta = self.issue_token(resource_id=f"event/{event_id}", undo={
            "kind": "compensate", "window": "P30D", "via": "api", "sideEffect": self.side_effect},
            revert={"status": "cancelled"}, summary=summary, version="v1")
        self.store.record({"op": "create_event", "event": event_id, "title": title, "attendees": attendees})
        self.store.save()
        return text_result(
            summary, structured={"eventId": event_id, "title": title, "start": start}, meta=meta
        )

    async def list_events(self, arguments):
        events = [r for key, r in self.records.items() if key.startswith("event/")]
        return text_result(f"{len(events)} events", structured={"events": events})

    def describe_undo(self, token):
        event = self.records[token["resource"]]
        return f"Cancel '{event['title']}' on {self._when(event['start'])}: {self.side_effect}"

    def revert(self, resource_id, record, revert):
        record["status"] = "cancelled"
        return {
            "notices": [
                {"to": attendee, "subject": f"Cancelled: {record['title']}"}
                for attendee in record["attendees"]
            ]
        }


class Mail(HatpServer):
    name = "mail"
    undo = {"kind": "none", "reason": "delivered to external recipients", "remedy": "send a correction email"}

    def tools(self):
        return [
            {"name": "send_email", "description": "Send an email.",
             "inputSchema": {"type": "object", "properties": {
                 "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
                 "required": ["to", "subject", "body"]},
             "_meta": self.journal_tool_meta(self.undo)},
        ]

    def handlers(self):
        return {"send_email": self.send_email}

    async def send_email(self, arguments):
        key = (arguments.get("__meta") or {}).get("idempotencyKey")  # a call sent again with it sends nothing
        return self.once(key, lambda: self._send(arguments, key))

    def _send(self, arguments, key: str | None):
        message_id = "M-" + secrets.token_hex(4)
        summary = f"Emailed '{arguments['subject']}' to {arguments['to']}"
        journal = self.sign({"undo": dict(self.undo),
                             "effect": {"summary": summary, "resource": f"mail://acme/message/{message_id}"}})
        self.store.record({"op": "send_email", "message": message_id, "to": arguments["to"],
                           "subject": arguments["subject"], "idempotencyKey": key})
        self.store.save()
        return text_result(summary, structured={"messageId": message_id}, meta={"hatp/journal": journal})


class Payments(SampleServer):
    """SEP-3172: `annotations.recovery` names `refund_payment`, bound to the charge's transactionId."""

    name = "payments"
    recovery = {"strategy": "compensation", "compensatingOperation": {
        "operationId": "refund_payment", "parameters": {"transactionId": "$response.body#/transactionId"}}}

    def initial_state(self):
        return {"ledger": [], "charges": {}, "idempotency": {}}

    def tools(self):
        return [
            {
                "name": "charge_payment",
                "description": "Charge a customer.",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "customer": {"type": "string"},
                        "amount": {"type": "string"},
                        "currency": {"type": "string"},
                    },
                    "required": ["customer", "amount"],
                },
                "outputSchema": {
                    "type": "object",
                    "properties": {"transactionId": {"type": "string"}, "amount": {"type": "string"}},
                    "required": ["transactionId", "amount"],
                },
                "annotations": {"recovery": self.recovery},
            },
            {
                "name": "refund_payment",
                "description": "Refund a charge in full.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"transactionId": {"type": "string"}},
                    "required": ["transactionId"],
                },
                "annotations": {"idempotentHint": True},
            },
        ]

    def handlers(self):
        return {"charge_payment": self.charge, "refund_payment": self.refund}

    async def charge(self, arguments):
        txn = "txn_" + secrets.token_hex(6)
        amount = str(arguments["amount"])
        self.store.data["charges"][txn] = {
            "customer": arguments["customer"],
            "amount": amount,
            "refunded": False,
        }
        self.store.record({"op": "charge", "transactionId": txn, "amount": amount})
        self.store.save()
        return text_result(f"Charged {amount} to {arguments['customer']}",
                           structured={"transactionId": txn, "amount": amount})

    async def refund(self, arguments):
        key = (arguments.get("__meta") or {}).get("idempotencyKey")
        return self.once(key, lambda: self._refund(arguments["transactionId"], key))

    def _refund(self, transaction: str, key: str | None) -> types.CallToolResult:
        charge = self.store.data["charges"].get(transaction)
        if charge is None:
            return tool_error(f"No charge {transaction}.", code="NOT_FOUND")
        if charge["refunded"]:
            return tool_error("Already refunded.", code="BUSINESS_RULE")
        charge["refunded"] = True
        self.store.record({"op": "refund", "transactionId": transaction, "idempotencyKey": key})
        return text_result(f"Refunded {charge['amount']}", structured={"refunded": charge["amount"]})


class Inventory(SampleServer):
    """mcp-compensate (ChronoMCP): `reserve_inventory` is released by `release_inventory` through
    parameterMapping."""

    name = "inventory"

    def initial_state(self):
        return {"ledger": [], "stock": {"SKU-GLOBEX-KIT": 40}, "reservations": {}, "idempotency": {}}

    def tools(self):
        compensate = {
            "reversibility": "compensable",
            "compensation": {
                "toolName": "release_inventory",
                "parameterMapping": {"id": "$.output.structuredContent.id"},
                "timeoutMs": 5000,
                "maxRetries": 2,
            },
            "sideEffectScope": ["warehouse"],
            "notes": "Releases the hold.",
        }
        return [
            {
                "name": "reserve_inventory",
                "description": "Hold stock for an order.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["sku", "quantity"],
                },
                "_meta": {"dev.chronomcp/compensate": compensate},
            },
            {
                "name": "release_inventory",
                "description": "Release a hold.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}},
                    "required": ["id"],
                },
                "_meta": {"dev.chronomcp/compensate": {"reversibility": "irreversible"}},
            },
            {
                "name": "check_stock",
                "description": "How many are free.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}},
                    "required": ["sku"],
                },
                "_meta": {"dev.chronomcp/compensate": {"reversibility": "readonly"}},
            },
        ]

    def handlers(self):
        return {
            "reserve_inventory": self.reserve,
            "release_inventory": self.release,
            "check_stock": self.check,
        }

    async def reserve(self, arguments):
        sku, quantity = str(arguments["sku"]), int(arguments["quantity"])
        if self.store.data["stock"].get(sku, 0) < quantity:
            return tool_error(
                f"Only {self.store.data['stock'].get(sku, 0)} of {sku} left.", code="BUSINESS_RULE"
            )
        self.store.data["stock"][sku] -= quantity
        reservation = "res_" + secrets.token_hex(5)
        self.store.data["reservations"][reservation] = {"sku": sku, "quantity": quantity, "released": False}
        self.store.record({"op": "reserve", "id": reservation, "sku": sku, "quantity": quantity})
        self.store.save()
        return text_result(
            f"Reserved {quantity} × {sku}", structured={"id": reservation, "sku": sku, "quantity": quantity}
        )

    async def release(self, arguments):
        key = (arguments.get("__meta") or {}).get("idempotencyKey")
        return self.once(key, lambda: self._release(arguments["id"], key))

    def _release(self, reservation_id: str, key: str | None) -> types.CallToolResult:
        reservation = self.store.data["reservations"].get(reservation_id)
        if reservation is None:
            return tool_error(f"No reservation {reservation_id}.", code="NOT_FOUND")
        if reservation["released"]:
            return tool_error("Already released.", code="BUSINESS_RULE")
        reservation["released"] = True
        self.store.data["stock"][reservation["sku"]] += reservation["quantity"]
        self.store.record({"op": "release", "id": reservation_id, "idempotencyKey": key})
        return text_result(f"Released {reservation_id}", structured={"released": reservation_id})

    async def check(self, arguments):
        count = self.store.data["stock"].get(str(arguments["sku"]), 0)
        return text_result(f"{count} free", structured={"sku": arguments["sku"], "free": count})


class Legacy(SampleServer):
    """Tools that say nothing about undo: every call through them is `unknown`."""

    name = "legacy"

    def initial_state(self):
        return {"ledger": [], "tickets": {}}

    def tools(self):
        return [
            {
                "name": "create_ticket",
                "description": "Open a support ticket.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"title": {"type": "string"}},
                    "required": ["title"],
                },
            },
            {"name": "echo", "description": "Answer with the arguments.", "inputSchema": {"type": "object"}},
            {
                "name": "blob",
                "description": "Answer with this many characters of text.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"size": {"type": "integer", "minimum": 0}},
                    "required": ["size"],
                },
                "annotations": {"readOnlyHint": True},
            },
        ]

    def handlers(self):
        return {"create_ticket": self.create_ticket, "echo": self.echo, "blob": self.blob}

    async def create_ticket(self, arguments):
        ticket = "T-" + secrets.token_hex(3).upper()
        self.store.data["tickets"][ticket] = {"title": arguments["title"]}
        self.store.record({"op": "create_ticket", "ticket": ticket, "title": arguments["title"]})
        self.store.save()
        return text_result(f"Opened {ticket}", structured={"ticket": ticket})

    async def echo(self, arguments):
        arguments.pop("__meta", None)
        return text_result("echo", structured=arguments)

    async def blob(self, arguments):
        return text_result("x" * min(int(arguments["size"]), 256 * 1024 * 1024))


ALL = (Crm, Calendar, Mail, Payments, Inventory, Legacy, Desk)
