"""The one exception users see for any plan/model mismatch."""


class PlanError(ValueError):
    """A plan that cannot be applied to this model, mesh or TP degree.

    Raised before anything is mutated. The message names the plan key, the module path, the numbers
    involved, the rule that failed and what to do about it.
    """
