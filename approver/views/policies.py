"""Autonomy policies, for admins only: the list with its change log, editing with a simulation, deleting."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from journal.auth import roles
from journal.auth.access import require_role

from .. import policy, services
from ..forms import PolicyForm
from ..models import AutonomyPolicy, PolicyChange

POLICY_CHANGES_SHOWN = 30


@require_GET
def policy_list(request):
    require_role(request, roles.ADMIN)
    rows = services.current_policies()
    return render(
        request,
        "approver/policy_list.html",
        {
            "policies": [
                (row, services.as_policy(row))
                for row in sorted(rows, key=lambda r: policy.SCOPES.index(r.scope))
            ],
            "classes": [
                (klass, policy.CLASS_SHORT[klass], policy.CLASS_WORDS[klass]) for klass in policy.CLASSES
            ],
            "changes": PolicyChange.objects.order_by("-seq")[:POLICY_CHANGES_SHOWN],
            "verdict": services.verify_policy_log(),
        },
    )


@require_http_methods(["GET", "POST"])
def policy_edit(request, policy_id=None):
    """Create or change a policy. "Simulate" (htmx, or a plain POST without JavaScript) shows what the draft
    would have decided for recent calls; "Save" records the change and it applies to the next call."""
    require_role(request, roles.ADMIN)
    row = get_object_or_404(AutonomyPolicy.objects.select_related("agent", "server", "team"), pk=policy_id) \
        if policy_id else AutonomyPolicy(decisions=dict(policy.DEFAULT_DECISIONS))
    form = PolicyForm(request.POST or None, instance=row)
    simulation = None
    if request.method == "POST" and form.is_valid():
        draft = form.save(commit=False)
        try:
            if "save" in request.POST:
                services.save_policy(row=draft, by=request.user)
                messages.success(request, f"Policy “{draft.name}” saved. It applies from the next call.")
                return redirect("approver:policy_list")
            services.clean_policy(draft)
            simulation = services.simulate_policy(draft=draft, last=form.cleaned_data.get("last") or 200)
        except services.PolicyRefused as refused:
            for field, problem in refused.problems.items():
                form.add_error(field if field in form.fields else None, problem)
    template = "approver/policy_edit.html#simulation" if request.htmx else "approver/policy_edit.html"
    return render(request, template, {"form": form, "row": row, "simulation": simulation})


@require_POST
def policy_delete(request, policy_id):
    require_role(request, roles.ADMIN)
    row = get_object_or_404(AutonomyPolicy.objects.select_related("agent", "server", "team"), pk=policy_id)
    services.delete_policy(row=row, by=request.user)
    messages.success(request, f"Policy “{row.name}” deleted. The next call is decided without it.")
    return redirect("approver:policy_list")
