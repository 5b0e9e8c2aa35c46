"""`benchmarks/mutants.py` stays runnable as the product moves: every mutant's file exists, its old text occurs
exactly once there (the script refuses anything else), and every covering test module exists. A refactor that moves
a mutated line fails here, not forty minutes into the benchmark."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutants", ROOT / "benchmarks" / "mutants.py")
mutants = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("mutants", mutants)  # dataclasses look their module up while the class is built
_spec.loader.exec_module(mutants)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=[m.name for m in mutants.MUTANTS])
def test_mutant_applies_to_the_current_tree(mutant):
    source = ROOT / mutant.path
    assert source.is_file(), f"{mutant.name}: {mutant.path} is gone; point the mutant at the line's new home"
    assert source.read_text().count(mutant.old) == 1, f"{mutant.name}: its old text is not in {mutant.path} once"
    for test in mutant.tests:
        assert (ROOT / test).is_file(), f"{mutant.name}: covering test {test} is gone"


def test_at_least_fifteen_mutants():
    assert len(mutants.MUTANTS) >= 15  # the floor; each kind of bug the suite must catch
