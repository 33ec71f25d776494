from django.urls import path

from . import views

app_name = "expenses"

urlpatterns = [
    path("", views.index, name="index"),
    path("tasks/", views.my_tasks, name="tasks"),
    path("expenses/<uuid:instance_id>/", views.detail, name="detail"),
    path("expenses/<uuid:instance_id>/receipt/", views.receipt, name="receipt"),
    path(
        "expenses/<uuid:instance_id>/tasks/<uuid:task_id>/<str:decision>/",
        views.complete,
        name="complete",
    ),
    path(
        "expenses/<uuid:instance_id>/<str:decision>/",
        views.decide,
        name="decide",
    ),
]
