import uuid

from django import forms


class ExpenseForm(forms.Form):
    """The expense form; the workflow's start_schema is the real validation."""

    amount = forms.IntegerField(help_text="below 100 is paid at once, otherwise it waits")
    description = forms.CharField(max_length=200)
    submitted_by = forms.CharField(max_length=255, initial="ann")
    # a fresh key per rendered form: submitting the same form twice starts one instance
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)
