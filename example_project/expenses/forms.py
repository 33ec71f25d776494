"""The demo forms: submit an expense, decide its approval task, send its receipt."""

import uuid

from django import forms


class ExpenseForm(forms.Form):
    """The expense form; the workflow's start_schema is the real validation."""

    amount = forms.IntegerField(help_text="below 100 is paid at once, otherwise it waits")
    description = forms.CharField(max_length=200)
    submitted_by = forms.CharField(max_length=255, initial="ann")
    # a fresh key per rendered form: submitting the same form twice starts one instance
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class ExpenseFormV2(ExpenseForm):
    """Version 2 also names the manager the approval task goes to."""

    manager = forms.CharField(
        max_length=255,
        initial="admin",
        required=False,  # blank: the workflow's default, the demo's admin
        help_text="user name the approval task is assigned to (the demo's admin)",
    )

    field_order = ["amount", "description", "submitted_by", "manager", "idempotency_key"]


class ApproveForm(forms.Form):
    """Approve the open task; the key makes a double submit one completion."""

    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class RejectForm(forms.Form):
    """Reject the open task. The decision's payload schema requires the reason
    (it is the real validation: an empty reason comes back as a form error)."""

    reason = forms.CharField(max_length=500, required=False)
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class ReceiptForm(forms.Form):
    """Send the receipt (its URL) the approved expense waits for: the ``receipt`` signal."""

    receipt_url = forms.CharField(max_length=500, label="Receipt URL")
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)
