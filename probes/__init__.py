"""Golden-answer quality probes and degeneracy detectors."""
