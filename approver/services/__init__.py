"""Every write on the approval side, one module per concept; views, tasks and commands call them as
`approver.services.X`.

- `plans`: ask for a reversal plan, draft it, cancel it.
- `checking`: a plan's rounds of checks against the tool servers.
- `approvals`: the one passkey ceremony (a plan, a held call) and the transitions a decision makes.
- `enrolment`: approvers' passkeys.
- `executor`: run an approved plan, and the reconciler.
- `controls`: pause, resume and abort a plan.
- `outcomes`: unknown outcomes, checked again, settled by hand or tried again.
- `rest`: plan the rest of a plan that stopped short.
- `leases`: plans' leases on the records they will change.
- `policies`: autonomy policies and their signed change log.
- `approval_rules`: who may sign and how many must, changes logged with the policies'.
- `recipes`: admins' undo recipes for servers that declare nothing, changes logged with the policies'.
- `held_calls`: the gate the Recorder asks, and the calls it holds.
- `bell`: the one doorbell to the worker.
- `tokens`: people's API tokens.

The reads that callers have always found here (a plan's content, who may sign, the policies' simulator) live
in `approver.content`, `approver.authority` and `approver.policy_book`, and are named here too.
"""

from ..authority import action_refusal, approvals_for_bundle, counting_approvals, signing_refusal
from ..checks import CheckResult
from ..content import conflict_positions, content_rows, items_for_page, plan_content, plan_url
from ..models import Plan
from ..policy_book import (
    POLICY_LOG,
    as_policy,
    current_policies,
    decide_call,
    plan_needs_a_human,
    policy_record,
    recent_calls,
    simulate_policy,
    verify_policy_log,
)
from .approval_rules import rules_record, save_approval_rules
from .approvals import (
    SIGNING_SECONDS,
    ActionRefused,
    approve,
    begin_action_signing,
    begin_signing,
    complete_action_signing,
    complete_signing,
    reject,
)
from .checking import WRITE_EVERY, finish_checks, queue_checks, record_checks, run_checks
from .controls import abort_plan, pause_plan, resume_plan
from .enrolment import (
    begin_enrolment,
    enroll_passkey,
    enrolment_challenge,
    passkey_registration_options,
    revoke_passkey,
    user_handle,
)
from .executor import (
    ExecutionStopped,
    compensation_call,
    enter_executing,
    execute_plan,
    queue_execution,
    reconcile_execution,
    recount,
)
from .held_calls import (
    HeldCallGate,
    action_digest,
    action_url,
    claim_approved_action,
    expire_held_calls,
    held_call_state,
    request_for_held_call,
    standing_words,
)
from .leases import LeaseRefused, break_lease
from .leases import expire as expire_leases
from .leases import for_page as leases_for_page
from .outcomes import SETTLEMENTS, NotSettled, check_unknown, retry_unknown, settle_unknown
from .plans import (
    DRAFT_STALE,
    PlanRefused,
    ask_for_plan,
    ask_to_undo_since,
    cancel_plan,
    draft_plan,
    request_plan,
    request_plan_since,
    step_facts,
)
from .policies import PolicyRefused, clean_policy, delete_policy, save_policy
from .recipes import PackUsed, Preview, preview, recipes_off, remove_recipe, save_recipe, use_pack
from .recipes import changes as recipe_changes
from .rest import live_rest, plan_the_rest, rest_refusal
from .tokens import TOKEN_PREFIX as API_TOKEN_PREFIX
from .tokens import TokenRefused, api_token_max_days, make_token, revoke_token, token_of

FINISHED_STATES = Plan.FINISHED_STATES

__all__ = [
    "API_TOKEN_PREFIX",
    "TokenRefused",
    "api_token_max_days",
    "make_token",
    "revoke_token",
    "token_of",
    "rules_record",
    "save_approval_rules",
    "PackUsed",
    "use_pack",
    "save_recipe",
    "remove_recipe",
    "recipes_off",
    "Preview",
    "preview",
    "recipe_changes",
    "DRAFT_STALE",
    "FINISHED_STATES",
    "POLICY_LOG",
    "SETTLEMENTS",
    "SIGNING_SECONDS",
    "WRITE_EVERY",
    "ActionRefused",
    "CheckResult",
    "ExecutionStopped",
    "HeldCallGate",
    "NotSettled",
    "PlanRefused",
    "PolicyRefused",
    "abort_plan",
    "action_digest",
    "action_refusal",
    "action_url",
    "approvals_for_bundle",
    "approve",
    "as_policy",
    "ask_for_plan",
    "begin_action_signing",
    "begin_signing",
    "cancel_plan",
    "check_unknown",
    "claim_approved_action",
    "clean_policy",
    "compensation_call",
    "complete_action_signing",
    "complete_signing",
    "conflict_positions",
    "content_rows",
    "counting_approvals",
    "current_policies",
    "decide_call",
    "delete_policy",
    "draft_plan",
    "begin_enrolment",
    "enrolment_challenge",
    "enroll_passkey",
    "enter_executing",
    "execute_plan",
    "expire_held_calls",
    "finish_checks",
    "held_call_state",
    "items_for_page",
    "live_rest",
    "LeaseRefused",
    "break_lease",
    "expire_leases",
    "standing_words",
    "leases_for_page",
    "plan_the_rest",
    "rest_refusal",
    "passkey_registration_options",
    "pause_plan",
    "plan_content",
    "plan_needs_a_human",
    "plan_url",
    "policy_record",
    "queue_checks",
    "queue_execution",
    "recent_calls",
    "reconcile_execution",
    "record_checks",
    "recount",
    "reject",
    "request_for_held_call",
    "request_plan",
    "request_plan_since",
    "ask_to_undo_since",
    "resume_plan",
    "retry_unknown",
    "revoke_passkey",
    "run_checks",
    "save_policy",
    "settle_unknown",
    "signing_refusal",
    "simulate_policy",
    "step_facts",
    "user_handle",
    "verify_policy_log",
]
