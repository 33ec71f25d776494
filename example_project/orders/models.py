"""The orders app's own table: one stock reservation per order, written by a branch."""

from django.db import models


class StockReservation(models.Model):
    """Written by the stock branch of ``OrderFulfilment`` in the segment's transaction.

    Unique per instance, so a retried segment never reserves twice.
    """

    instance_id = models.UUIDField(unique=True, help_text="the workflow instance that reserved")
    sku = models.CharField(max_length=64)
    quantity = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku}"


class PaymentCharge(models.Model):
    """The fake payment provider's ledger (``orders/payments.py``): one row per charge.

    Keyed by the dispatch key the relay sends as idempotency key, so a call
    made twice (a relay that died after charging) charges once.
    """

    idempotency_key = models.CharField(max_length=512, unique=True)
    reference = models.CharField(max_length=100)
    amount = models.IntegerField()
    status = models.CharField(max_length=16, default="CHARGED")  # CHARGED, REFUNDED
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.amount} for {self.reference} ({self.status})"
