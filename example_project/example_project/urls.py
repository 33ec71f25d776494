"""URLs of the example project: the expenses demo at /, the orders at /orders/, the admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", include("orders.urls")),
    path("", include("expenses.urls")),
]
