"""`dtp run` launched as two nodes (two torchrun agents on this machine, `--nnodes 2 --rdzv-backend c10d`, one
process each) draws the same image as the one-node launch with two processes: tp=2 over gloo either way."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np

from dtp.families.pipelines import tiny_checkpoint

RUN = ["-m", "dtp", "run", "--prompt", "a cat", "--steps", "2", "--height", "32", "--width", "32", "--seed", "5"]
RUN += ["--dtype", "fp32"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_two_agents_draw_the_one_node_image(tmp_path):
    model_dir = tiny_checkpoint("flux", root=tmp_path)
    common = [*RUN, "--model-dir", str(model_dir)]
    launcher = [sys.executable, "-m", "torch.distributed.run"]
    port = free_port()
    nodes = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "dtp-two-nodes",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
    ]  # fmt: skip
    out = [*common, "--output", str(tmp_path / "two.png"), "--save-pixels", str(tmp_path / "two.npy")]
    agents = [
        subprocess.Popen([*launcher, *nodes, *out], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    logs = [agent.communicate(timeout=600)[0].decode(errors="replace") for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(log[-2000:] for log in logs)
    one = [*common, "--output", str(tmp_path / "one.png"), "--save-pixels", str(tmp_path / "one.npy")]
    done = subprocess.run([*launcher, "--standalone", "--nproc-per-node", "2", *one], env=_env(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    two, reference = np.load(tmp_path / "two.npy"), np.load(tmp_path / "one.npy")
    assert np.abs(two - reference).max() <= 1e-6  # the same ranks, plan and collectives
