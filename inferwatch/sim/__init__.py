"""A simulated vLLM replica on a simulated NVIDIA GPU, for demos, drills and tests.

It serves the OpenAI API with vLLM's response shapes, vLLM 0.33's /metrics, a dcgm-exporter
endpoint and an admin endpoint for fault injection, while a continuous-batching scheduler over a
paged KV cache (sized by :mod:`inferwatch.capacity.planner`) produces tokens at the speed a
roofline of the chosen GPU and model allows.

Modules: ``simulator`` (configuration, engine ranks, request planning, faults), ``engine`` (the
stepping task), ``scheduler`` and ``kvcache`` (batching and blocks), ``roofline`` (step times),
``answers`` (golden answers and filler), ``metrics`` (vLLM families), ``gpu`` (DCGM readings),
``faults`` (the fault document), ``openai_api`` and ``server`` (HTTP; ``run_in_thread`` and
``start_subprocess`` start one from code), ``cli`` (``inferwatch sim``).
"""
