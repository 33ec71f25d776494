from django.contrib import admin

from .models import Payment


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ["created_at", "amount", "paid_to", "approved_by", "description", "instance_id"]
    search_fields = ["description", "paid_to", "instance_id"]
