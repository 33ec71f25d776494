from django.urls import path

from . import views

app_name = "orders"

urlpatterns = [
    path("", views.index, name="index"),
    path("<uuid:instance_id>/", views.detail, name="detail"),
    path("<uuid:instance_id>/pay/", views.confirm_payment, name="pay"),
    path("<uuid:instance_id>/ship/", views.ship, name="ship"),
    path(
        "<uuid:instance_id>/tasks/<uuid:task_id>/<str:decision>/",
        views.review,
        name="review",
    ),
]
