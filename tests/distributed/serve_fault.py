"""`dtp` with a fault planted in one rank's image post-processing, for the test of `dtp serve`'s failure path.

    torchrun --nproc-per-node 2 tests/distributed/serve_fault.py serve --model-dir DIR ...

Rank `DTP_TEST_FAIL_RANK` raises in `image_processor.postprocess` for images of `DTP_TEST_FAIL_SIZE` pixels square:
after the denoising loop and the (split) VAE decode, where the other ranks do not wait for it in a collective, so
the server's agreement step is what must notice. A test fixture: product code never reads these variables.
"""

from __future__ import annotations

import os
import sys

from dtp.tools import serve
from dtp.tools.cli import main


def _faulty(open_pipeline):
    def load(*args, **kwargs):
        pipe = open_pipeline(*args, **kwargs)
        postprocess = pipe.image_processor.postprocess
        size = int(os.environ["DTP_TEST_FAIL_SIZE"])

        def failing_postprocess(image, *a, **k):
            if os.environ.get("RANK", "0") == os.environ["DTP_TEST_FAIL_RANK"] and image.shape[-1] == size:
                raise RuntimeError(f"planted failure in rank {os.environ['RANK']}'s postprocess")
            return postprocess(image, *a, **k)

        pipe.image_processor.postprocess = failing_postprocess
        return pipe

    return load


if __name__ == "__main__":
    serve.open_pipeline = _faulty(serve.open_pipeline)
    sys.exit(main(sys.argv[1:]))
