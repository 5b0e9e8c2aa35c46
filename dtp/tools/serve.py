"""`dtp serve` (written next)."""


def run(args) -> int:
    raise NotImplementedError
