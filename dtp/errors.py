"""The exceptions users see, and the promise each one makes."""


class PlanError(ValueError):
    """A plan that cannot be applied to this model, mesh or TP degree.

    Raised before anything is mutated: the model is exactly as it was. The message names the plan
    key, the module path, the numbers involved, the rule that failed and what to do about it.
    """


class ForwardError(ValueError):
    """An input that a sharded model cannot take, found while it runs (the model is already sharded).

    Examples: a sequence length the `cp` degree does not divide, an attention module that finished
    without calling the context-parallel dispatcher. Not a PlanError: sharding already happened.
    """


class CheckpointError(PlanError):
    """A checkpoint that cannot be loaded into this model; raised before any tensor byte is read.

    Defined here, torch-free, so `dtp run --model-dir` can be refused before torch loads (`tools/early.py`);
    `dtp.loading.checkpoint.CheckpointError` is this class."""
