"""Exactness: checks that run the model (on meta tensors) or read the bound plan's rows, after binding and the
transforms, before anything is mutated: declared packed blocks, head alignment (`alignment.py`), the sharded
forward's data flow (`flow.py`, with values carried through data-dependent shapes by `meta_values.py`).
`exact.check_exact` runs them in order. Their memo is bounded and clearable (`memo.py`).
"""
