"""Binding: a plan bound to one model at one tp degree, from its shapes alone (no forward run, nothing mutated).

globs (keys -> modules) -> linears (a `Layout` per planned parameter, the bias rule) -> heads / text_attention
(head bookkeeping) -> norms, outputs, embeddings, ties -> pairs (the colwise/rowwise pair rule) -> constraints
(what tp must divide) -> resolved (`resolve`, the `Resolved` value); cp (the plan's `cp` section).
"""
