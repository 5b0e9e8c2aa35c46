"""Analysis as a library: everything dtp knows about a plan and a model without running them for real.

    fakepg       full-size models on the meta device in torch's fake process group (any world size)
    released     released pipelines' component configs (FLUX.1-dev, FLUX.2-dev, Qwen-Image ...)
    collectives  counting the collectives a forward issues, and the ones a plan implies
    lint         a traced forward's data flow checked against the plan
    suggest      a plan proposed from a traced forward
    verify       per-module divergence of a sharded forward from one process
    check        the per-rank layout, bytes and collectives of a plan at full size (`dtp check`)
    launch       N local processes in one process group (verify, tests, benchmarks)

The command line (`dtp/tools/`) only parses arguments and prints what these return.
"""
