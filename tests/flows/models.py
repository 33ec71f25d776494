"""A model the test workflows write to, to prove ORM writes share the segment transaction."""

from __future__ import annotations

from django.db import models


class Shipment(models.Model):
    order_ref = models.CharField(max_length=64)
    created_by_step = models.CharField(max_length=64)

    class Meta:
        app_label = "flows"


class HandlerCall(models.Model):
    """One call of a test service handler (counted across processes: the relay-kill test)."""

    handler = models.CharField(max_length=64)
    dispatch_key = models.CharField(max_length=512)
    attempt = models.IntegerField()

    class Meta:
        app_label = "flows"
