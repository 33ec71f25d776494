from django.contrib import admin

from .models import StockReservation


@admin.register(StockReservation)
class StockReservationAdmin(admin.ModelAdmin):
    list_display = ("sku", "quantity", "instance_id", "created_at")
