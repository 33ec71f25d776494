"""URLs of the example project: the expenses demo at / and the Django admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("expenses.urls")),
]
