"""A model the test workflows write to, to prove ORM writes share the segment transaction."""

from __future__ import annotations

from django.db import models


class Shipment(models.Model):
    order_ref = models.CharField(max_length=64)
    created_by_step = models.CharField(max_length=64)

    class Meta:
        app_label = "flows"
