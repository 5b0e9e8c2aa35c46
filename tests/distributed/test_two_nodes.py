"""`dtp run` launched as two nodes (two torchrun agents on this machine, `--nnodes 2 --rdzv-backend c10d`, two
processes each, gloo): ring cp=2 across the nodes x tp=2 inside each draws the one-process image (fp32 pixels
within mean 1e-6 / max 1e-4, the bound of every sharded run against one process; the reference runs in this
process), and tp=4, whose one group would span both nodes, is refused by `make_mesh` with the axis named
(`runtime/nodes.py`) before anything loads. USP (`--cp 4 --ulysses 2`): ring 2 across the nodes x Ulysses 2 inside
each draws the same image; plain Ulysses over the 4 ranks (`--cp 4`), whose one group spans both nodes, is refused
naming the ulysses axis, and runs with `--allow-cross-node`."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.serving import LAUNCHER, free_port, quiet_env
from dtp.tools.cli import main

RUN = ["run", "--prompt", "a cat", "--steps", "2", "--height", "32", "--width", "32", "--seed", "5"]
RUN += ["--dtype", "fp32"]


def two_agents(args: list[str]) -> tuple[list[int], list[str]]:
    """Run `python -m dtp ARGS` under two torchrun agents of two processes each; (return codes, logs)."""
    port = free_port()
    nodes = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "dtp-two-nodes",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
    ]  # fmt: skip
    agents = [
        subprocess.Popen(
            [*LAUNCHER, *nodes, "-m", "dtp", *args], env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)
    ]
    logs = [agent.communicate(timeout=600)[0].decode(errors="replace") for agent in agents]
    return [agent.returncode for agent in agents], logs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """(the tiny FLUX.1 checkpoint, the one-process run's pixels)."""
    tmp = tmp_path_factory.mktemp("two_nodes")
    model_dir = tiny_checkpoint("flux")  # the shared cache: built once per machine, only read
    one = [*RUN, "--model-dir", str(model_dir), "--output", str(tmp / "one.png"), "--save-pixels", str(tmp / "one.npy")]
    assert main(one) == 0
    return model_dir, np.load(tmp / "one.npy").astype(np.float64)


# two agents x 2 processes and a one-process run (~50 s on 2 cores): `full`; the refusal below stays default.
@pytest.mark.full
@pytest.mark.parametrize(
    "mesh",
    [
        ["--cp", "2", "--cp-mode", "ring"],  # ring across the nodes x tp 2 inside each
        ["--cp", "4", "--ulysses", "2"],  # USP: ring 2 across the nodes x Ulysses 2 inside each
        ["--cp", "4", "--allow-cross-node"],  # plain Ulysses over both nodes, asked for
    ],
)
def test_two_agents_draw_the_one_process_image(tmp_path, one_process, mesh):
    model_dir, reference = one_process
    out = [*RUN, "--model-dir", str(model_dir), "--output", str(tmp_path / "two.png")]
    codes, logs = two_agents([*out, "--save-pixels", str(tmp_path / "two.npy"), *mesh])
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    diff = np.abs(np.load(tmp_path / "two.npy").astype(np.float64) - reference)
    print(f"{' '.join(mesh)}: mean {diff.mean():.2e} max {diff.max():.2e} vs one process")
    assert diff.mean() <= 1e-6 and diff.max() <= 1e-4, (diff.mean(), diff.max())


@pytest.mark.full
def test_ulysses_across_the_two_agents_is_refused(tmp_path):
    """--cp 4 as plain Ulysses on 2 nodes x 2 ranks: its one group spans both nodes; refused naming the axis."""
    model_dir = tiny_checkpoint("flux")
    out = [*RUN, "--model-dir", str(model_dir), "--output", str(tmp_path / "x.png"), "--cp", "4"]
    codes, logs = two_agents(out)
    assert all(code != 0 for code in codes), codes
    assert any("the ulysses group of ranks [0, 1, 2, 3] spans 2 nodes" in log for log in logs), logs[0][-3000:]


@pytest.mark.full  # suite time (24 s, 4 processes): the node rule itself is test_nodes / test_usp_cli
def test_tp_across_the_two_agents_is_refused(tmp_path):
    """tp=4 on 2 nodes x 2 ranks: the one tp group spans both nodes; every rank fails with the axis named."""
    model_dir = tiny_checkpoint("flux")
    codes, logs = two_agents([*RUN, "--model-dir", str(model_dir), "--output", str(tmp_path / "x.png")])
    assert all(code != 0 for code in codes), codes
    assert any("the tp group of ranks [0, 1, 2, 3] spans 2 nodes" in log for log in logs), logs[0][-3000:]
