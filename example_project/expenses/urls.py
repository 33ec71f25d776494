from django.urls import path

from . import views

app_name = "expenses"

urlpatterns = [
    path("", views.index, name="index"),
    path("expenses/<uuid:instance_id>/", views.detail, name="detail"),
    path(
        "expenses/<uuid:instance_id>/<str:decision>/",
        views.decide,
        name="decide",
    ),
]
