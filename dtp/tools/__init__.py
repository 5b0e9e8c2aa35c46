"""The `dtp` command line and what it runs: check, run, demo (and their helpers)."""
