"""A real model, RoPE methods against transformers (1/2): PI (``linear``), dynamic NTK (``dynamic``) and YaRN
(``yarn``) on SmolLM2-135M give the logits of transformers' own rope type set in the config by hand, on 2,048 tokens
of Pride and Prejudice, to ``real_model_rope.TOL`` (measured: 0 difference: the same computation). Dynamic NTK runs
with an original context of 1,024 so that its base is recomputed at the 2,048-token length (at SmolLM2's own 8,192
it would be plain RoPE here). LongRoPE and llama3: tests/test_real_model_rope2.py."""
from __future__ import annotations

import itertools

import pytest
from real_model_rope import ORIG, TOL, compare

from rope_scaling import RopeSpec

CASES = {
    "pi": (RopeSpec("pi", 2), {"rope_type": "linear", "factor": 2.0}, 2 * ORIG),
    "dynamic_ntk": (RopeSpec("dynamic_ntk", 2, orig_ctx=1024), {"rope_type": "dynamic", "factor": 2.0}, 1024),
    "yarn": (RopeSpec("yarn", 2), {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIG,
                                   "beta_fast": 32.0, "beta_slow": 1.0}, 2 * ORIG),
}


@pytest.fixture(scope="module")
def results(smollm2, austen_ids):
    return {m: compare(smollm2, austen_ids, *case) for m, case in CASES.items()}


@pytest.mark.parametrize("method", list(CASES))
def test_same_logits_as_transformers_rope_type(results, method):
    diff, _ = results[method]
    assert diff <= TOL, f"{method}: max |logit difference| {diff:.2e}"


def test_the_methods_differ(results):
    """The teeth: each method's logits differ from the others' (a method that did nothing would pass above)."""
    for a, b in itertools.combinations(results, 2):
        assert (results[a][1] - results[b][1]).abs().max() > 0.05, (a, b)
