"""Demo app of the example project: expense approval workflows."""
