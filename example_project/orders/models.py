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
