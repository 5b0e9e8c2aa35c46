"""Bundled sharding plans (YAML), installed as the package `dtp.plans`; see dtp/plan_io.py."""
