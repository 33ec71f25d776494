from django.contrib import admin

from .models import BankOutage, Payment


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ["created_at", "amount", "paid_to", "approved_by", "description", "instance_id"]
    search_fields = ["description", "paid_to", "instance_id"]


@admin.register(BankOutage)
class BankOutageAdmin(admin.ModelAdmin):
    """Delete an outage to fix the cause of a dead-lettered payment, then retry the instance."""

    list_display = ["payee", "note"]
