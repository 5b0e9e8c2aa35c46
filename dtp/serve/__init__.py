"""`dtp serve`: generations over HTTP from a pipeline loaded once and sharded over every rank.

worker   the lockstep loop every rank runs: rank 0 broadcasts each batch of requests (or a heartbeat, or stop)
         over a gloo group, every rank generates, the ranks agree on the outcome
batch    the batch key and one pipeline call for a batch (a generator per request)
jobs     the queue in front of the loop (batches by key, cancel) and the job / result objects it carries
store    the video jobs in SQLite under --state-dir: accepted, in progress, finished; queued again after a restart
api      OpenAI's image and video bodies (JSON or multipart) as checked Requests
http     the FastAPI application rank 0 serves (OpenAI's images and videos APIs), run by uvicorn
metrics  GET /metrics (prometheus_client)
replicas --replicas R: R sharded copies over world / R ranks each; rank 0 routes each batch to an idle one over
         torchrun's store (Router on rank 0, Relay on the other replicas' leaders)
peers    ends every rank when one rank's failure leaves the others inside a collective
"""
