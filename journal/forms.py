from django import forms

from .models import Agent, Run
from .services.runs import runs_matching

# A moment, as the browser's own picker gives it (in the server's time zone, as pages show times).
_WHEN = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class RunFilterForm(forms.Form):
    agent = forms.ModelChoiceField(
        queryset=Agent.objects.all(), required=False, empty_label="All agents", to_field_name="name"
    )
    state = forms.ChoiceField(choices=[("", "Any state"), *Run.State.choices], required=False)
    since = forms.DateTimeField(required=False, label="Active since", widget=_WHEN)
    until = forms.DateTimeField(required=False, label="Active until", widget=_WHEN)

    def filter(self, runs):
        if not self.is_valid():
            return runs.none()
        return runs_matching(runs, agent=self.cleaned_data["agent"], state=self.cleaned_data["state"],
                             since=self.cleaned_data["since"], until=self.cleaned_data["until"])
