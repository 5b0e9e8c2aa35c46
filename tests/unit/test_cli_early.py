"""`dtp run` / `dtp serve` refuse what is wrong without torch before importing it (`dtp/tools/early.py`): the
same message and exit code as the command's later check, and under torchrun one line per node, exit code 1."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtp.errors import CheckpointError, PlanError
from dtp.tools import failure
from dtp.tools.commands import build_parser
from dtp.tools.early import check_arguments

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 200  # measured: 121 in sys.modules after the refusal (torch alone imports ~1,500)

PROBE = """
import json, sys
from dtp.tools.cli import main
code = main(["run", "--model-dir", sys.argv[1], "--prompt", "cat"])
heavy = sorted(name for name in ("torch", "diffusers", "transformers", "numpy", "PIL") if name in sys.modules)
print(json.dumps({"code": code, "modules": len(sys.modules), "heavy": heavy}))
"""


def test_a_missing_model_dir_is_refused_before_torch(tmp_path):
    """The whole `dtp run` up to its refusal, in a fresh interpreter: exit 1, the CheckpointError's text, no heavy
    library imported and few modules at all."""
    missing = tmp_path / "nonexistent"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(missing)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 1 and result["heavy"] == [], result
    assert result["modules"] < MAX_MODULES, result
    assert done.stderr.strip() == (
        f"dtp run: --model-dir {missing} does not exist; pass a diffusers pipeline folder (the one holding "
        "model_index.json, e.g. downloaded with huggingface_hub.snapshot_download)."
    ), done.stderr


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A folder with a model_index.json naming a transformer: what the early checks accept."""
    folder = tmp_path / "pipe"
    folder.mkdir()
    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def parse(*argv):
    return build_parser().parse_args(list(argv))


def run_args(model_dir, *more):
    return parse("run", "--model-dir", str(model_dir), "--prompt", "cat", *more)


def test_a_pipeline_folder_and_plain_arguments_pass(model_dir, tmp_path):
    """The negative control: nothing wrong, nothing refused (also a LoRA file, an image, a prompts file)."""
    for name in ("l.safetensors", "i.png", "p.jsonl"):
        (tmp_path / name).write_text("x")
    check_arguments(run_args(model_dir))
    check_arguments(parse("run", "--model-dir", str(model_dir), "--prompts", str(tmp_path / "p.jsonl")))
    lora, image = f"s={tmp_path / 'l.safetensors'}", str(tmp_path / "i.png")
    check_arguments(run_args(model_dir, "--lora", lora, "--image", image))
    check_arguments(parse("serve", "--model-dir", str(model_dir), "--max-batch", "4"))
    check_arguments(parse("check", "flux", "--tp", "2"))  # not a loading command: nothing checked here
    check_arguments(run_args(model_dir, "--lora", "owner/style-lora"))  # maybe a Hub id: diffusers' to say


@pytest.mark.parametrize("path", ["/no/l", "./l", "~/l", "a/b/c", "l.safetensors", "owner/l.safetensors"])
def test_a_lora_path_that_can_only_be_local_must_exist(model_dir, path):
    with pytest.raises(PlanError, match=f"--lora s={path}: {path} does not exist"):
        check_arguments(run_args(model_dir, "--lora", f"s={path}"))


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (None, "has no model_index.json"),
        ({"_class_name": "X"}, "names no diffusers transformer component (None)"),
        ({"transformer": [None, None]}, "names no diffusers transformer component ([None, None])"),
    ],
)
def test_a_folder_that_is_no_pipeline_is_a_checkpoint_error(tmp_path, index, expected):
    if index is not None:
        (tmp_path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_arguments(run_args(tmp_path))


def test_a_modular_pipeline_folder_passes(tmp_path):
    (tmp_path / "modular_model_index.json").write_text(json.dumps({"transformer": ["diffusers", "T", {}]}))
    check_arguments(run_args(tmp_path))


@pytest.mark.parametrize(
    ("more", "expected"),
    [
        (["--cache-threshold", "0.1"], "--cache-threshold needs --cache NAME."),
        (["--cp", "0"], "--cp must be a positive integer, got 0."),
        (["--cfg", "-1"], "--cfg must be a positive integer, got -1."),
        (["--steps", "0"], "steps must be a positive integer, got 0."),
        (["--pipeline-arg", "no-equals"], "--pipeline-arg 'no-equals': expected KEY=VALUE"),
        (["--lora", "s=/nonexistent/l.safetensors"], "--lora s=/nonexistent/l.safetensors: /nonexistent/l.s"),
        (["--image", "/nonexistent/i.png"], "image /nonexistent/i.png: cannot read it as an image ([Errno 2]"),
    ],
)
def test_run_arguments_refused_with_the_commands_words(model_dir, more, expected):
    with pytest.raises(PlanError) as info:
        check_arguments(run_args(model_dir, *more))
    assert str(info.value).startswith(expected), str(info.value)


def test_an_unreadable_prompts_file(model_dir, tmp_path):
    with pytest.raises(PlanError, match="cannot read it"):
        check_arguments(parse("run", "--model-dir", str(model_dir), "--prompts", str(tmp_path / "none.jsonl")))


def test_serve_options_refused_before_loading(model_dir, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    serve = ["serve", "--model-dir", str(model_dir)]
    with pytest.raises(PlanError, match="--max-batch 0 / --batch-wait-ms 0.0: at least 1 / 0."):
        check_arguments(parse(*serve, "--max-batch", "0"))
    with pytest.raises(PlanError, match="launch with torchrun"):
        check_arguments(parse(*serve, "--replicas", "2"))


class Exited(Exception):
    pass


@pytest.fixture
def torchrun_env(monkeypatch, tmp_path):
    """This process as torchrun's rank 1 of 2 on a node; `_exit` raises instead of ending the test."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in {**env, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(failure, "EARLY_WAIT_S", 0.0)
    monkeypatch.setattr(failure, "_exit", lambda code: (_ for _ in ()).throw(Exited(code)))
    return tmp_path / "error.json"


@pytest.mark.parametrize(("local_rank", "printed"), [("0", "rank 1: dtp run: bad"), ("1", "")])
def test_under_torchrun_one_line_per_node_exit_1(torchrun_env, monkeypatch, capsys, local_rank, printed):
    """One line per node (its local rank 0), torchrun's error file written by every rank, exit code 1."""
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    with pytest.raises(Exited) as info:
        failure.report_early(PlanError("bad"), "run")
    assert info.value.args == (1,)
    assert capsys.readouterr().err.strip() == printed
    assert json.loads(torchrun_env.read_text())["message"]["extraInfo"]["py_callstack"] == "dtp run: bad"
