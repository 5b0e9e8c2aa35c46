"""The suite's scope: which families the family-wide modules run by default (dtp.testing.scope)."""

from dtp.testing import scope
from dtp.testing.tiny import PLAN_CLASSES


def test_every_kind_is_a_bundled_plan():
    """A kind names a bundled plan (a renamed or dropped family would silently leave its kind unrun)."""
    assert set(scope.KINDS) <= set(PLAN_CLASSES), sorted(set(scope.KINDS) - set(PLAN_CLASSES))


def test_a_family_outside_the_kinds_runs_only_in_the_full_run(monkeypatch):
    """A family that is not a kind's (a new one, or one repeating a covered kind) is `full`; a kind's always runs."""
    outside = sorted(set(PLAN_CLASSES) - set(scope.KINDS))
    assert outside, "every family a kind of its own: nothing left for DTP_FULL=1"
    monkeypatch.delenv("DTP_FULL", raising=False)
    assert not any(scope.family_runs(name) for name in outside + ["a_new_family"])
    assert all(scope.family_runs(name) for name in scope.KINDS)
    monkeypatch.setenv("DTP_FULL", "1")
    assert all(scope.family_runs(name) for name in outside + list(scope.KINDS))


def test_each_kind_takes_one_slot_of_a_mechanism(monkeypatch):
    """`default_slot`: by default every kind's family runs in exactly one slot of a mechanism (tp=2 or tp=4, a cp
    mesh), the slots share the kinds evenly, and a family outside the kinds runs in none; all in all with DTP_FULL=1."""
    monkeypatch.delenv("DTP_FULL", raising=False)
    for slots in (2, 3):
        taken = {name: [s for s in range(slots) if scope.default_slot(name, s, slots)] for name in scope.KINDS}
        assert all(len(found) == 1 for found in taken.values()), taken
        sizes = [sum(found == [s] for found in taken.values()) for s in range(slots)]
        assert max(sizes) - min(sizes) <= 1, sizes
        assert not any(scope.default_slot("a_new_family", s, slots) for s in range(slots))
    monkeypatch.setenv("DTP_FULL", "1")
    assert all(scope.default_slot(name, s, 2) for name in [*scope.KINDS, "a_new_family"] for s in range(2))
