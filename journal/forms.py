from django import forms

from .models import Agent, Run


class RunFilterForm(forms.Form):
    agent = forms.ModelChoiceField(
        queryset=Agent.objects.all(), required=False, empty_label="All agents", to_field_name="name"
    )
    state = forms.ChoiceField(choices=[("", "Any state"), *Run.State.choices], required=False)

    def filter(self, runs):
        if not self.is_valid():
            return runs.none()
        if self.cleaned_data["agent"]:
            runs = runs.filter(agent=self.cleaned_data["agent"])
        if self.cleaned_data["state"]:
            runs = runs.filter(state=self.cleaned_data["state"])
        return runs
