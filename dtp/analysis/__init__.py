"""Analysis as a library: everything dtp knows about a plan and a model without running them for real.

    fakepg       full-size models on the meta device in torch's fake process group (any world size)
    released     the released pipelines (`families/released_pipelines.py`) built on the meta device
    inputs       full-size forward inputs from each family's geometry (image pixels, usual video clip)
    forward      the full-size trace engine: build, cut blocks, fake world, shard, fake tensors, trace
    trace        one traced forward: live-storage peak, FLOPs and collectives (`PhaseTrace`), block cutting
    repeats      replaying a submodule's repeated calls in a trace (Wan's per-frame VAE decoder)
    collectives  counting the collectives a forward issues, and the ones a plan implies
    lint         a traced forward's data flow checked against the plan
    suggest      a plan proposed from a traced forward
    verify       per-module divergence of a sharded forward from one process
    check        the per-rank layout, bytes, collectives and peak of a plan at full size (`dtp check`)
    launch       N local processes in one process group (verify, tests, benchmarks)

The command line (`dtp/tools/`) only parses arguments and prints what these return.
"""
