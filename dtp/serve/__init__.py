"""`dtp serve`: generations over HTTP from a pipeline loaded once and sharded over every rank.

worker   the lockstep loop every rank runs: rank 0 broadcasts each request (or a heartbeat, or stop)
         over a gloo group, every rank generates, the ranks agree on the outcome
jobs     the queue in front of the loop and the request / result objects it carries
http     the FastAPI application rank 0 serves (OpenAI's /v1/images/generations body), run by uvicorn
"""
