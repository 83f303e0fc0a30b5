"""The start-up source: a replica's cold-start phases (``phases``) and the warm-up gate that
holds readiness until the engine has served a round of requests (``warmup``)."""
