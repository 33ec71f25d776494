#!/usr/bin/env python
"""Django's command-line utility for the example project.

Run from anywhere, e.g. ``python example_project/manage.py migrate``. The
database comes from ``DATABASE_URL`` or the ``PG*`` variables; ``./scripts/demo``
starts a throwaway PostgreSQL and sets them.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    # example_project/ holds the project package and the ``expenses`` app
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
