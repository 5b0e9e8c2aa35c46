"""What `dtp check`'s process imports and how it collects garbage (issue 45: the command's time; not a timed test).

One subprocess imports the check command's module as the CLI does and then runs `main()` as the process entry
with a stub command, so both facts are read where they hold: a fresh interpreter that is the `dtp` command.
"""

import gc
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from dtp.tools import cli, commands

ROOT = Path(__file__).resolve().parents[2]

# Never imported by `dtp check`, each with why it would be there by mistake.
NOT_IMPORTED = {
    "fastapi": "the HTTP server of `dtp serve` (dtp.serve.http)",
    "uvicorn": "runs `dtp serve`'s app",
    "av": "video files of `dtp run` / `dtp serve`",
    "dtp.serve": "the server package: check shares nothing with it",
    "diffusers.pipelines": "diffusers' pipeline classes (~600 modules): check builds transformers, "
    "and a released pipeline's components only when asked (`flux-pipeline`), from inside the call",
}

PROBE = """
import gc, json, sys, types
from dtp.tools import cli, commands
cli.command_module("check")  # the check command's module, imported as `main` imports it
imported = sorted(name for name in {names} if name in sys.modules)
stub = types.SimpleNamespace(run=lambda args: 0)
commands.COMMANDS["check"] = commands.COMMANDS["check"].__class__("stub", commands._check, lambda: stub)
frozen = {{}}
for name, argv in (("passed", ["check", "flux", "--tp", "2"]), ("entry", None)):
    sys.argv = ["dtp", "check", "flux", "--tp", "2"]
    before = gc.get_freeze_count()
    cli.main(argv)
    frozen[name] = gc.get_freeze_count() - before
print(json.dumps({{"imported": imported, "frozen": frozen, "enabled": gc.isenabled()}}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    code = PROBE.format(names=sorted(NOT_IMPORTED))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_check_command_imports_no_server_video_or_pipeline_module(probe):
    """`import` of `dtp check`'s module (torch and diffusers' model classes) pulls in none of `NOT_IMPORTED`."""
    assert probe["imported"] == [], {name: NOT_IMPORTED[name] for name in probe["imported"]}


def test_only_the_command_process_freezes_its_objects(probe):
    """`main()` as the process entry freezes what the imports made (gc.freeze: the full passes and shutdown's
    collection skip it); `main(argv)` called by a program (a test) leaves that program's collector untouched."""
    assert probe["frozen"]["passed"] == 0, probe
    assert probe["frozen"]["entry"] > 100_000, probe  # torch + diffusers: ~440,000 objects
    assert probe["enabled"], probe


def test_main_in_process_leaves_the_collector_as_it_was(monkeypatch):
    """The collector is paused only while a command's module imports, and enabled again after, even on a failure."""
    seen = {}

    def run(args) -> int:
        seen["during run"] = gc.isenabled()
        return 0

    def module():
        seen["during import"] = gc.isenabled()
        return types.SimpleNamespace(run=run)

    monkeypatch.setitem(commands.COMMANDS, "check", commands.Command("stub", commands._check, module))
    frozen = gc.get_freeze_count()
    assert cli.main(["check", "flux", "--tp", "2"]) == 0
    assert seen == {"during import": False, "during run": True}
    assert gc.isenabled() and gc.get_freeze_count() == frozen

    def failing():
        raise ImportError("a command module that cannot import")

    monkeypatch.setitem(commands.COMMANDS, "check", commands.Command("stub", commands._check, failing))
    with pytest.raises(ImportError):
        cli.main(["check", "flux", "--tp", "2"])
    assert gc.isenabled()
