"""`dtp --help` and `import dtp` import neither torch nor diffusers; what the parsers repeat equals its home."""

import re
import subprocess
import sys
import types
from pathlib import Path

from dtp import choices, policy
from dtp.analysis import check, verify
from dtp.analysis.released import RELEASED_PIPELINES
from dtp.cache import names as cache_names
from dtp.families.pipelines import CHECKPOINTS
from dtp.fit.hardware import HARDWARE
from dtp.plan import bundled_plan_names
from dtp.quant import SCHEMES
from dtp.runtime import launch
from dtp.tools import commands
from dtp.tools import fit as fit_command
from dtp.tools.cli import command_module

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers", "numpy", "yaml")

PROBE = """
import sys
import dtp
from dtp.tools.cli import main
from dtp.tools.commands import COMMANDS
for argv in (["--help"], *([name, "--help"] for name in sorted(COMMANDS))):
    try:
        main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
print("imported:", *sorted(name for name in {heavy} if name in sys.modules))
"""


def test_help_and_import_load_no_heavy_library():
    """Every `--help` answers (exit 0) with torch, diffusers, transformers, numpy and yaml never imported."""
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "imported:", done.stdout.strip().splitlines()[-1]


def test_the_parsers_and_the_library_read_one_home():
    """The values the parsers show are `dtp.choices`' own objects in the modules that use them; the tables keyed
    by those names have exactly those keys."""
    assert policy.CP_MODES is choices.CP_MODES and commands.CP_MODES is choices.CP_MODES
    assert check.DEFAULT_TEXT_TOKENS is choices.DEFAULT_TEXT_TOKENS
    assert verify.DEFAULT_TOL is choices.DEFAULT_TOL
    assert fit_command.TABLE_ROWS is choices.FIT_TABLE_ROWS
    assert launch.DEFAULT_TIMEOUT_S is choices.DEFAULT_TIMEOUT_S
    assert commands.bundled_plan_names() == bundled_plan_names()
    assert tuple(policy.DTYPES) == choices.DTYPE_NAMES
    assert tuple(RELEASED_PIPELINES) == choices.RELEASED_PIPELINES
    assert set(choices.DEMO_MODELS) == set(CHECKPOINTS)
    assert tuple(HARDWARE) == choices.HARDWARE_NAMES
    assert tuple(sorted(SCHEMES)) == choices.RUN_QUANT_SCHEMES
    assert set(choices.QUANT_SCHEMES) < set(SCHEMES)
    assert cache_names.CACHE_NAMES is choices.CACHE_NAMES


def test_every_command_has_a_runner():
    parser = commands.build_parser()
    for name in commands.COMMANDS:
        assert command_module(name).__name__ == f"dtp.tools.{name}"
        assert callable(command_module(name).run), name
        assert parser.parse_args([name, *_required(name)]).command == name


def _required(name: str) -> list[str]:
    return {
        "run": ["--model-dir", "x", "--prompt", "p"],
        "serve": ["--model-dir", "x"],
        "check": ["flux", "--tp", "2"],
        "verify": ["M", "--tp", "2"],
        "suggest": ["M"],
        "fit": ["flux-pipeline", "--gpus", "2", "--gpu-memory", "24GiB"],
    }.get(name, [])


def test_the_facade_names_the_public_functions():
    """Every public name resolves; importing the submodule `dtp.parallelize` leaves `dtp.parallelize` the function."""
    import dtp.parallelize  # noqa: F401 - the submodule import that would rebind the package attribute

    assert isinstance(dtp.parallelize, types.FunctionType) and dtp.parallelize.__module__ == "dtp.parallelize"
    assert sorted(dtp.__all__) == sorted(dtp._EXPORTS)
    for name in dtp.__all__:
        assert getattr(dtp, name).__name__ == name, name


def test_the_docs_name_the_tiny_checkpoint_folder_the_code_writes():
    folder = CHECKPOINTS["flux"][0]
    for path in (ROOT / "README.md", ROOT / "examples" / "tensor_parallel_flux.py"):
        named = set(re.findall(r"tiny-flux-pipeline-v\d+", path.read_text()))
        assert named == {folder}, (path.name, named)
