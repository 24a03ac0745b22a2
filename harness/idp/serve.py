"""Run the IdP: migrate its SQLite database, then serve on ``ADDRPORT`` until stopped.

``DJANGO_SETTINGS_MODULE=harness.idp.settings python -m harness.idp.serve
127.0.0.1:<port>`` (from the repository root). One process for both steps: the fixture
pays for Django's start once.
"""

from __future__ import annotations

import sys

import django
from django.core.management import call_command


def main(addrport: str) -> None:
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    # Threaded, as a browser and a test talk to it at once; no reloader: one process to stop.
    call_command("runserver", addrport, use_reloader=False, skip_checks=True)


if __name__ == "__main__":
    main(sys.argv[1])
