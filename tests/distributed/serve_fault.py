"""`dtp` with a fault planted in one rank, for the tests of `dtp serve`'s failure paths.

    torchrun --nproc-per-node 2 tests/distributed/serve_fault.py serve --model-dir DIR ...

- `DTP_TEST_FAIL_RANK` raises in `image_processor.postprocess` for images of `DTP_TEST_FAIL_SIZE` pixels square:
  after the denoising loop and the (split) VAE decode, where the other ranks do not wait for it in a collective,
  so the server's agreement step is what must notice.
- `DTP_TEST_STUCK_RANK` raises as its transformer is called on latents `DTP_TEST_STUCK_WIDTH` wide: the other ranks
  go on into the sharded forward and wait inside its first collective, which the failed rank never joins. The
  peer-failure watcher's grace is lowered to `DTP_TEST_GRACE_S` (the released 30 s would only slow the test).

A test fixture: product code never reads these variables.
"""

from __future__ import annotations

import os
import sys

from dtp.serve import peers
from dtp.tools import serve
from dtp.tools.cli import main


def _is_rank(variable: str) -> bool:
    return os.environ.get(variable) is not None and os.environ.get("RANK", "0") == os.environ[variable]


def _plant_postprocess_failure(pipe) -> None:
    postprocess = pipe.image_processor.postprocess
    size = int(os.environ["DTP_TEST_FAIL_SIZE"])

    def failing_postprocess(image, *a, **k):
        if image.shape[-1] == size:
            raise RuntimeError(f"planted failure in rank {os.environ['RANK']}'s postprocess")
        return postprocess(image, *a, **k)

    pipe.image_processor.postprocess = failing_postprocess


def _plant_transformer_failure(pipe) -> None:
    width = int(os.environ["DTP_TEST_STUCK_WIDTH"])

    def raise_on_entry(module, args, kwargs):
        # dtp's cp entry passes the latents on by position
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        if hidden.shape[-1] == width:
            raise RuntimeError(f"planted failure in rank {os.environ['RANK']}'s transformer")

    pipe.transformer.register_forward_pre_hook(raise_on_entry, with_kwargs=True)


def _faulty(open_pipeline):
    def load(*args, **kwargs):
        pipe = open_pipeline(*args, **kwargs)
        if _is_rank("DTP_TEST_FAIL_RANK"):
            _plant_postprocess_failure(pipe)
        if _is_rank("DTP_TEST_STUCK_RANK"):
            _plant_transformer_failure(pipe)
        return pipe

    return load


if __name__ == "__main__":
    serve.open_pipeline = _faulty(serve.open_pipeline)
    if "DTP_TEST_GRACE_S" in os.environ:
        peers.GRACE_S = float(os.environ["DTP_TEST_GRACE_S"])
    sys.exit(main(sys.argv[1:]))
