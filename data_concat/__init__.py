"""data_concat: training data and evaluation data the CNNSum way (arXiv 2412.02819).

- ``pack``: render short summarization pairs with the Appendix F.2 prompts and concatenate them at random into
  14–18K / 30–34K token training samples (Sec 5), loss on the summaries only -> OUT/train.parquet.
- ``pairs``: real pairs from the shared novels (chapter text -> its heading couplet).
- ``sample``: the multi-scale sliding-window sampler of Sec 3.2 (L/XL/2XL/3XL or a scaled-down target).
- ``unique-marks``: a packed recall set with each pair's marks in brackets of its own (``marks``).

Modules: ``pack`` (reading and encoding pairs, the command), ``packing`` (the concatenation algorithm), ``packed``
(the packed-set format: its one writer and one reader), ``pairs``, ``sampler``, ``cuts`` (chapters measured in
tokens), ``recall``, ``marks``. CLI: ``python -m data_concat COMMAND --help`` (pack, stats, pairs, sample, recall,
text, unique-marks).
"""
from .pack import TARGETS, EncodedPair, PackSettings, Pair, encode_pairs, pack, pack_encoded, read_pairs, resolve_range
from .packed import PackedSet, compute_stats, load_meta, load_packed, read_packed, stats_of
from .packing import Plan, plan_packing
from .pairs import build_pairs
from .sampler import balance, sample, sliding_windows

__all__ = ["TARGETS", "EncodedPair", "Pair", "PackSettings", "PackedSet", "Plan", "balance", "build_pairs",
           "compute_stats", "encode_pairs", "load_meta", "load_packed", "pack", "pack_encoded", "plan_packing",
           "read_packed", "read_pairs", "resolve_range", "sample", "sliding_windows", "stats_of"]
