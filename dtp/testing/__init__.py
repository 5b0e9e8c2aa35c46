"""Test fixtures: tiny configs and pipelines, a local multi-process launcher, parity helpers."""
