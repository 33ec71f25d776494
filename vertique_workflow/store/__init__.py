"""Every SQL statement of the app, one module per table family.

Statements are named constants rendered once with the placement of
``tables.py``; nothing outside this package builds SQL.
"""
