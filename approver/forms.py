from django import forms


class UndoRequestForm(forms.Form):
    from_step = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=2000, strip=True,
        widget=forms.TextInput(attrs={"placeholder": "Why undo? (shown to the approver)", "autocomplete": "off"}),
        error_messages={"required": "Say why this should be undone: the approver reads it."},
    )
