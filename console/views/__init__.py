"""The console's views, one module per area: ``system`` (health, errors), ``queue``,
``operations``. URLs import the modules, never names re-exported from here."""
