"""Runtime: the mesh, device placement, the ParallelStyles, head rewriting, context parallelism."""
