from django import forms

from journal import roles

from . import policy
from .models import AutonomyPolicy


class UndoRequestForm(forms.Form):
    from_step = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=2000, strip=True,
        widget=forms.TextInput(attrs={"placeholder": "Why undo? (shown to the approver)", "autocomplete": "off"}),
        error_messages={"required": "Say why this should be undone: the approver reads it."},
    )


class PolicyForm(forms.ModelForm):
    """An autonomy policy as admins edit it: one allow/ask/deny choice per class of call. The service
    (`services.clean_policy`) has the last word on what may be saved."""

    approver_group = forms.ChoiceField(choices=[(r, r) for r in roles.ALL], initial=roles.APPROVER)
    last = forms.IntegerField(min_value=10, max_value=5000, initial=200, required=False,
                              help_text="How many recent calls the simulator replays.")

    class Meta:
        model = AutonomyPolicy
        fields = ["name", "scope", "agent", "server", "tool", "approver_group", "quorum", "ask_timeout",
                  "auto_run_plans"]
        widgets = {"tool": forms.TextInput(attrs={"placeholder": "e.g. send_email", "autocomplete": "off"})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        current = self.instance.decisions or policy.DEFAULT_DECISIONS
        for klass in policy.CLASSES:
            self.fields[f"decision_{klass}"] = forms.ChoiceField(
                label=policy.CLASS_LABELS[klass], choices=[(d, d) for d in policy.DECISIONS],
                initial=current.get(klass, "ask"), widget=forms.RadioSelect)

    def decision_fields(self):
        return [self[f"decision_{klass}"] for klass in policy.CLASSES]

    def clean(self):
        cleaned = super().clean()
        self.instance.decisions = {klass: cleaned.get(f"decision_{klass}") for klass in policy.CLASSES}
        return cleaned
