"""Degeneracy screening of sampled live completions, for the tenancy proxy.

The proxy hands over the prompt and the completion of a sampled request; only counters
leave this object (per model and model version, by signal), never any text. The live
signals are the ones that mean something without a reference answer: ``empty``,
``repetition`` and ``wrong_script`` (``finish_reason=length`` is the client's choice of
``max_tokens`` on live traffic, so it is not counted here).

Usage in the proxy::

    sampler = DegeneracySampler(rate=0.05)
    if sampler.should_sample():
        sampler.observe(model, model_version, prompt_text, completion_text)
    ...
    sampler.families()  # on /metrics
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Final

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.probes import degeneracy

LIVE_SIGNALS: Final[tuple[degeneracy.Signal, ...]] = ("empty", "repetition", "wrong_script")


class DegeneracySampler:
    def __init__(self, rate: float = 0.05, rng: random.Random | None = None) -> None:
        if not 0 <= rate <= 1:
            raise ValueError(f"sample rate {rate} is not between 0 and 1")
        self.rate = rate
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._sampled: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._fired: defaultdict[tuple[str, str, str], int] = defaultdict(int)

    def should_sample(self) -> bool:
        return self.rate > 0 and self._rng.random() < self.rate

    def observe(
        self,
        model: str,
        model_version: str,
        prompt: str,
        completion: str,
        *,
        has_tool_call: bool = False,
    ) -> frozenset[degeneracy.Signal]:
        """Screen one completion, count it, and return the signals that fired."""
        fired = degeneracy.detect(
            completion,
            allowed=degeneracy.allowed_scripts(prompt[: degeneracy.MAX_CHARS]),
            has_tool_call=has_tool_call,
        ) & frozenset(LIVE_SIGNALS)
        with self._lock:
            self._sampled[(model, model_version)] += 1
            for signal in fired:
                self._fired[(model, model_version, signal)] += 1
        return fired

    def families(self) -> list[Metric]:
        cat = catalog.load()
        sampled = cat.family("quality_sampled_outputs")
        degenerate = cat.family("quality_degenerate_outputs")
        with self._lock:
            for (model, version), n in sorted(self._sampled.items()):
                sampled.add_metric([model, version], n)
                for signal in LIVE_SIGNALS:
                    # Zero series exist from the first sample, so rate() works from the start.
                    degenerate.add_metric(
                        [model, version, signal], self._fired.get((model, version, signal), 0)
                    )
        return [sampled, degenerate]
