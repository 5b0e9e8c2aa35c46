"""Transforms: a `Resolved` plan rewritten for a tp degree it would not take as is, exactly: zero-padded heads and
widths (`padding.py`, `pad=True`) and kv heads shared by several ranks when tp exceeds them (`kv_share.py`).
"""
