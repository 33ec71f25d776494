"""The demo app's own table: one Payment per paid expense, written by the workflow."""

from django.db import models


class Payment(models.Model):
    """Written by the ``pay`` step of ``ExpenseApproval`` in the segment's transaction."""

    instance_id = models.UUIDField(unique=True, help_text="the workflow instance that paid")
    amount = models.IntegerField()
    description = models.CharField(max_length=200)
    paid_to = models.CharField(max_length=255)
    approved_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.amount} to {self.paid_to} ({self.description})"


class BankOutage(models.Model):
    """The demo's repairable failure: the bank refuses payments to this payee.

    While a row names an expense's submitter, its ``pay`` step raises (a
    retryable error): the step spends its attempts and the command is
    dead-lettered. Deleting the row in the admin fixes the cause; a retry of
    the instance then pays. ``./scripts/demo`` seeds one for "mallory".
    """

    payee = models.CharField(max_length=255, unique=True)
    note = models.CharField(max_length=255, blank=True, default="")

    def __str__(self) -> str:
        return f"bank refuses payments to {self.payee}"
