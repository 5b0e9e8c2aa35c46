"""A user error ends `dtp run` / `dtp demo` as one message on stderr and exit code 1, without a traceback;
the one-process run reports a damaged checkpoint with the sharded loader's own CheckpointError."""

import json
import os
import shutil
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist
from diffusers import FluxTransformer2DModel

import dtp
from dtp.analysis.fakepg import fake_world
from dtp.errors import ForwardError, PlanError
from dtp.families.pipelines import tiny_checkpoint
from dtp.loading.checkpoint import WEIGHTS_NAME, CheckpointError
from dtp.tools import failure
from dtp.tools.cli import main

MAX_LINES = 5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("DTP_CACHE")
    os.environ["DTP_CACHE"] = str(cache)
    try:
        yield tiny_checkpoint("flux")
    finally:
        os.environ.pop("DTP_CACHE") if old is None else os.environ.__setitem__("DTP_CACHE", old)


@pytest.fixture
def damaged(checkpoint, tmp_path):
    """A copy of the tiny pipeline whose transformer files the test then damages."""
    return shutil.copytree(checkpoint, tmp_path / "pipeline")


def _run(capsys, *argv) -> tuple[int, list[str]]:
    code = main(["run", "--prompt", "cat", "--steps", "1", "--height", "32", "--width", "32", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def _sharded_loader_message(directory) -> str:
    """What dtp's shard-on-load says about these files (a fake group of 1: it fails before reading a byte)."""
    with fake_world(1), pytest.raises(CheckpointError) as info:
        dtp.from_pretrained(FluxTransformer2DModel, str(directory), dtp.make_mesh(tp=1, device_type="cpu"))
    return str(info.value)


def test_a_missing_model_dir_is_one_line(capsys, tmp_path):
    code, lines = _run(capsys, "--model-dir", str(tmp_path / "nonexistent"))
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"dtp run: --model-dir {tmp_path / 'nonexistent'} does not exist; pass a diffusers")


def test_a_folder_without_model_index_is_one_line(capsys, tmp_path):
    code, lines = _run(capsys, "--model-dir", str(tmp_path))
    assert code == 1 and lines == [lines[0]] and "has no model_index.json" in lines[0], lines


def test_a_truncated_transformer_gives_the_sharded_loaders_message(capsys, damaged):
    """One process (diffusers loads it) and shard-on-load say the same words about the same file."""
    weights = damaged / "transformer" / WEIGHTS_NAME
    os.truncate(weights, os.path.getsize(weights) - 100)
    code, lines = _run(capsys, "--model-dir", str(damaged))
    assert code == 1 and len(lines) == 1, lines
    assert "is truncated" in lines[0]
    assert lines[0] == f"dtp run: {_sharded_loader_message(damaged / 'transformer')}"


def test_a_wrong_shape_gives_the_sharded_loaders_message(capsys, damaged):
    config = damaged / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "joint_attention_dim": 48}))
    code, lines = _run(capsys, "--model-dir", str(damaged))
    assert code == 1 and len(lines) <= MAX_LINES, lines
    assert "context_embedder.weight" in lines[0]
    assert "\n".join(lines) == f"dtp run: {_sharded_loader_message(damaged / 'transformer')}"


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        main(["run", "--model-dir", str(tmp_path / "nonexistent"), "--prompt", "cat", "--debug"])


def test_demo_with_a_missing_plan_file_is_one_line(capsys, checkpoint, tmp_path):
    code = main(["demo", "--plan", str(tmp_path / "nope.yaml")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and err == [f"dtp demo: plan file {tmp_path / 'nope.yaml'} does not exist."], err


@pytest.mark.parametrize("error", [PlanError("tp=3 does not divide 4"), ForwardError("cp=2 does not divide 7")])
def test_report_prints_one_prefixed_line(capsys, error):
    assert failure.report(error, "run") == 1
    assert capsys.readouterr().err == f"dtp run: {error}\n"
    assert failure.message(PlanError("dtp run: already prefixed"), "run") == "dtp run: already prefixed"


def test_format_ranks():
    assert failure.format_ranks({0: "dtp run: a", 1: "dtp run: a"}) == "dtp run: a"
    assert failure.format_ranks({0: "a", 1: "b", 2: "a"}) == "ranks 0, 2: a\nrank 1: b"


def _ranks_report(messages: dict[int, str]) -> list[str]:
    """Every rank of `messages` runs its part of `failure.report` in a thread, through one real TCPStore."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    printed = []
    original = failure._print
    failure._print = printed.append
    try:
        connect = lambda: dist.PrefixStore(failure.STORE_PREFIX, master)  # noqa: E731
        threads = [
            threading.Thread(target=failure._report_rank, args=(text, rank, len(messages), connect))
            for rank, text in messages.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        failure._print = original
    return "\n".join(printed).splitlines()


def test_ranks_with_one_message_print_it_once():
    assert _ranks_report({0: "dtp run: x", 1: "dtp run: x"}) == ["dtp run: x"]


def test_ranks_with_different_messages_print_one_line_each():
    assert sorted(_ranks_report({0: "dtp run: x", 1: "dtp run: y"})) == ["rank 0: dtp run: x", "rank 1: dtp run: y"]
