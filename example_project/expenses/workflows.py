"""The demo workflows of the example project are defined here.

vertique_workflow discovers a ``workflows.py`` module in every installed app,
the way the admin discovers ``admin.py``. This one will hold the expense
approval workflow of ``docs/`` (validate, route, manager review task, receipt
wait, pay) once the definition API lands; until then it is intentionally
empty, and the demo shows the workflow tables in the Django admin.
"""
