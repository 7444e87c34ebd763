"""A real model, RoPE methods against transformers (2/2): LongRoPE (``longrope``: YaRN x2's per-pair factors as the
long factors, 1.05 as the short ones) and Llama 3.1 scaling (``llama3``) on SmolLM2-135M give the logits of
transformers' own rope type set in the config by hand, on 2,048 tokens of Pride and Prejudice, to
``real_model_rope.TOL`` (measured: 0 difference). Both run with an original context of 1,024, so that 2,048 tokens are
past it: LongRoPE switches to its long factors, llama3 divides every pair slower than 1,024 tokens a turn."""
from __future__ import annotations

import pytest
from real_model_rope import BASE, TOL, compare

from rope_scaling import RopeSpec
from rope_scaling.formulas import rescale_factors
from rope_scaling.spec import LongRopeFactors

D = 64  # SmolLM2's head_dim: 32 rotary pairs
LONG = tuple(rescale_factors(RopeSpec("yarn", 2, orig_ctx=1024), D, BASE))
SHORT = (1.05,) * (D // 2)
CASES = {
    "longrope": (RopeSpec("longrope", 2, orig_ctx=1024, longrope_factors=LongRopeFactors(SHORT, LONG)),
                 {"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 1024,
                  "short_factor": list(SHORT), "long_factor": list(LONG)}, 2048),
    "llama3": (RopeSpec("llama3", 2, orig_ctx=1024),
               {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 1024,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 2048),
}


@pytest.fixture(scope="module")
def results(smollm2, austen_ids):
    return {m: compare(smollm2, austen_ids, *case) for m, case in CASES.items()}


@pytest.mark.parametrize("method", list(CASES))
def test_same_logits_as_transformers_rope_type(results, method):
    diff, _ = results[method]
    assert diff <= TOL, f"{method}: max |logit difference| {diff:.2e}"


def test_the_methods_differ(results):
    assert (results["longrope"][1] - results["llama3"][1]).abs().max() > 0.05
    assert max(LONG) > 1.9 and min(LONG) == 1.0  # YaRN's factors: 1 (kept) to 2 (interpolated)
