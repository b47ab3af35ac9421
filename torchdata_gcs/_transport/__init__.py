"""The wire: the process's I/O loop, the HTTP sessions and credentials, what an answer (or its absence)
means, retry and backoff, the 429 throttle, and the request context every engine shares. Nothing here
knows about objects beyond URLs."""
