"""The test app. ``VERTIQUE_TEST_HIDE_WORKFLOWS=id:version,...`` makes this process lack
those plans, as a node running older code would during a rolling deploy."""

from __future__ import annotations

import os

from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "tests.flows"
    label = "flows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from vertique_workflow.definitions import catalog

        for item in filter(None, os.environ.get("VERTIQUE_TEST_HIDE_WORKFLOWS", "").split(",")):
            definition_id, _, version = item.partition(":")
            catalog.remove(definition_id, int(version or 1))
