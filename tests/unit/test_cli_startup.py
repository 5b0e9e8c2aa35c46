"""`dtp --help` and `import dtp` import neither torch nor diffusers; what the parsers repeat equals its home."""

import re
import subprocess
import sys
import types
from pathlib import Path

from dtp import policy
from dtp.analysis import check, verify
from dtp.analysis.released import RELEASED_PIPELINES
from dtp.cache import names as cache_names
from dtp.families.pipelines import CHECKPOINTS
from dtp.fit.hardware import HARDWARE
from dtp.plan import bundled_plan_names
from dtp.tools import commands, run
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


def test_the_copies_in_the_parsers_equal_their_homes():
    assert commands.CP_MODES == policy.CP_MODES
    assert tuple(policy.DTYPES) == commands.DTYPE_NAMES
    assert commands.bundled_plan_names() == bundled_plan_names()
    assert tuple(RELEASED_PIPELINES) == commands.RELEASED_PIPELINES
    assert commands.CHECK_DTYPES == check.CHECK_DTYPES
    assert commands.DEFAULT_TIMEOUT_S == run.DEFAULT_TIMEOUT_S
    assert commands.DEFAULT_TOL == verify.DEFAULT_TOL
    assert commands.DEFAULT_TEXT_TOKENS == check.DEFAULT_TEXT_TOKENS
    assert set(commands.DEMO_MODELS) == set(CHECKPOINTS)
    assert tuple(HARDWARE) == commands.HARDWARE_NAMES
    assert commands.FIT_TABLE_ROWS == fit_command.TABLE_ROWS
    assert commands.CACHE_NAMES == cache_names.CACHE_NAMES


def test_every_command_has_a_runner():
    parser = commands.build_parser()
    for name, module in commands.COMMANDS.items():
        assert command_module(name).__name__ == module
        assert callable(command_module(name).run), module
        assert parser.parse_args([name, *_required(name)]).command == name


def _required(name: str) -> list[str]:
    return {
        "run": ["--model-dir", "x", "--prompt", "p"],
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
