"""Data files shipped with the package: the JSON Schema of workflow documents."""
