import json

from django import forms

from journal.auth import roles

from . import policy
from .models import AutonomyPolicy


class StepNumbers(forms.Field):
    """Step numbers sent as repeated values (ticked checkboxes): positive integers, at most `limit` of them.
    Whether the run has them is the service's question."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *, limit: int, **kwargs):
        self.limit = limit
        super().__init__(**kwargs)

    def to_python(self, value) -> list[int]:
        values = list(value or [])
        if len(values) > self.limit:
            raise forms.ValidationError(
                f"Choose at most {self.limit} steps at once, or undo from a step onwards."
            )
        if not all(isinstance(v, str) and v.isdigit() and 0 < len(v) < 10 and int(v) > 0 for v in values):
            raise forms.ValidationError("Steps are chosen by their numbers.")
        return sorted({int(v) for v in values})


class UndoRequestForm(forms.Form):
    """Undo a run from step N onwards (`from_step`), or the steps ticked on the run page (`steps`)."""

    from_step = forms.IntegerField(min_value=1, required=False, widget=forms.HiddenInput)
    steps = StepNumbers(limit=500, required=False)  # a run page shows 200; Django refuses over 1,000 fields
    reason = forms.CharField(
        max_length=2000,
        strip=True,
        widget=forms.TextInput(
            attrs={"placeholder": "Why undo? (shown to the approver)", "autocomplete": "off"}
        ),
        error_messages={"required": "Say why this should be undone: the approver reads it."},
    )

    def clean(self):
        cleaned = super().clean()
        if "steps" in self.errors or "from_step" in self.errors:
            return cleaned
        if (cleaned.get("from_step") is None) == (not cleaned.get("steps")):
            raise forms.ValidationError("Tick the steps to undo, or undo from one step onwards.")
        return cleaned


class UndoSinceForm(forms.Form):
    """Undo everything an agent did since a moment, across its runs. The moment is read in the site's time
    zone (the page says which), to the second."""

    since = forms.DateTimeField(
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"),
        error_messages={"required": "Say since when: a date and a time.",
                        "invalid": "Give the moment as a date and a time, like 2026-12-02 03:10."},
    )
    reason = forms.CharField(
        max_length=2000,
        strip=True,
        widget=forms.TextInput(
            attrs={"placeholder": "Why undo? (shown to the approver)", "autocomplete": "off"}
        ),
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
        fields = ["name", "scope", "team", "agent", "server", "tool", "approver_group", "quorum",
                  "ask_timeout", "auto_run_plans", "allow_unknown_retries", "on_failure"]
        widgets = {"tool": forms.TextInput(attrs={"placeholder": "e.g. send_email", "autocomplete": "off"})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["on_failure"].required = False
        current = self.instance.decisions or policy.DEFAULT_DECISIONS
        for klass in policy.CLASSES:
            self.fields[f"decision_{klass}"] = forms.ChoiceField(
                label=policy.CLASS_LABELS[klass], choices=[(d, d) for d in policy.DECISIONS],
                initial=current.get(klass, "ask"), widget=forms.RadioSelect)

    def clean_on_failure(self):
        # Left out (an older form, an API client): a failure is just an error, as before the option existed.
        return self.cleaned_data.get("on_failure") or AutonomyPolicy.OnFailure.NOTHING

    def decision_fields(self):
        return [self[f"decision_{klass}"] for klass in policy.CLASSES]

    def clean(self):
        cleaned = super().clean()
        self.instance.decisions = {klass: cleaned.get(f"decision_{klass}") for klass in policy.CLASSES}
        return cleaned


class PackForm(forms.Form):
    """Put a recipe pack in force for a tool server (`journal.undo.packs`)."""

    pack = forms.ChoiceField(choices=())
    needs_human = forms.BooleanField(
        required=False, initial=True,
        label="A person signs every undo these recipes make (else they run under the plan policies)")

    def __init__(self, *args, packs: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["pack"].choices = [(name, name) for name in packs]


class RecipeForm(forms.Form):
    """One recipe, as JSON (docs/undo.md says how to write one); whether it fits is the service's question."""

    recipe = forms.CharField(max_length=64_000, widget=forms.Textarea(attrs={
        "rows": 18, "spellcheck": "false", "autocomplete": "off", "class": "code"}))

    def clean_recipe(self) -> dict:
        try:
            value = json.loads(self.cleaned_data["recipe"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"This is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("A recipe is one JSON object (with tool, schemaDigest, kind, …).")
        return value
