"""The approval side's state, one module a concept: reversal plans and their items (`plans`), passkeys and
approvals (`approvals`), autonomy policies (`policies`), the calls they hold (`held_calls`) and the plans'
holds on records (`leases`),
and people's API tokens (`tokens`). Every change goes through `approver.services`."""

from .approvals import Approval, ApprovalRules, Passkey, PasskeyQuerySet, SigningRequest
from .held_calls import ActionApproval, ActionRequest
from .leases import RecordLease
from .plans import Plan, PlanItem, PlanQuerySet
from .policies import ALREADY_COVERED, AutonomyPolicy, PolicyChange
from .tokens import PersonalToken
from .webhooks import EVENTS as WEBHOOK_EVENTS
from .webhooks import WebhookDelivery, WebhookEndpoint

__all__ = [
    "ALREADY_COVERED",
    "ActionApproval",
    "ActionRequest",
    "Approval",
    "ApprovalRules",
    "AutonomyPolicy",
    "Passkey",
    "PasskeyQuerySet",
    "PersonalToken",
    "Plan",
    "PlanItem",
    "PlanQuerySet",
    "PolicyChange",
    "RecordLease",
    "SigningRequest",
    "WEBHOOK_EVENTS",
    "WebhookDelivery",
    "WebhookEndpoint",
]
