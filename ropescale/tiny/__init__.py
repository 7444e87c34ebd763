"""The builder of the embedded tiny default: what ``--model tiny`` (the default of every command) is, and how it was
made. No stage imports this package: they read the committed build through ``ropescale.common.models``; only
``make-tiny`` (:mod:`.make_tiny`), the tests and the benchmarks that make random tiny models use it.

The tiny default is a Qwen2-architecture model (Llama-style RoPE, RMSNorm, SwiGLU; 3.5M parameters, 4 layers) with a
short original context (512 tokens, rope_theta 10000) and a 2,048-token byte-level BPE tokenizer, both made here from
the shared novels, pretrained so that it *uses* its context: it copies passages it has seen and answers the recall
task of ``ropescale.common.recall`` (write out the sentences marked 【1】..【K】 in the input) inside its 512 tokens.
That is what lets RoPE scaling show a real effect on a CPU: what a method does to positions past 512 changes what it
can reach.

- ``build``: the spec (:class:`~.build.TinySpec`), the tokenizer and the model config, :func:`~.build.build_tiny`;
- ``mixture``: the pretraining windows (:class:`~.mixture.Mixture`) and the loop (:func:`~.mixture.pretrain`);
- ``metrics``: what a build measures (held-out perplexity, the copy effect, recall ROUGE-L);
- ``make_tiny``: the ``make-tiny`` command.

The build is deterministic for a spec on a given machine, torch version and thread count. The build of the default
spec is committed in ``assets/tiny/`` (its ``tiny.json`` holds the spec, the sha256 of the weights, the build's
metrics and log). ``python -m ropescale make-tiny --build`` rebuilds it from scratch (about an hour on 2 CPU cores)
and says whether the weights came out bit-identical to the asset; another spec (``--steps N``) is built into
``$ROPESCALE_CACHE/tiny-<hash>``.
"""
