"""Issue 33 phase 2: the positions policy through the training path -- the pack's boundaries (``read_packed``), the
dataset + collator (position ids, segment ids, padding), the model finetune builds (LoRA, gradient checkpointing, the
label-only head) and the trainer's position coverage."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from ft_helpers import packed

from ropescale.common.io import InputError
from ropescale.training.data import Collator, PackedDataset, load_rows
from ropescale.training.positions import PAD_SEGMENT, Coverage, Policy


@pytest.fixture(scope="module")
def rows(chapters, tiny_tokenizer_dir, tmp_path_factory):
    out = packed(chapters, tiny_tokenizer_dir, tmp_path_factory.mktemp("pos") / "packed", 300, 480, n=24)
    r = load_rows(out, boundaries=True)
    starts = r.pair_starts()
    assert starts is not None and len(starts) == len(r)
    assert sum(len(s) > 1 for s in starts) >= 2  # samples of several pairs: the masks below have work to do
    return r


def _finetune_model(model_dir, memory: bool = False):
    """The model as finetune builds it (ropescale.training.run.build_model): RoPE applied, LoRA on q/k/v/o (no
    dropout: deterministic), trained embeddings and norms, gradient checkpointing, the label-only head in chunks;
    ``memory``: also each layer's checkpoint offloaded to host memory and the MLP tiled (ropescale.training.memory)."""
    from rope_scaling import RopeSpec
    from rope_scaling.load import load_config
    from ropescale.training.loss import install_label_only_forward
    from ropescale.training.memory.offload import enable_checkpoint_offload
    from ropescale.training.memory.tiled_mlp import enable_tiled_mlp
    from ropescale.training.model import add_lora, load_model

    cfg = load_config(model_dir, RopeSpec("yarn", 8))
    peft_model, _ = add_lora(load_model(cfg, torch.float32, "sdpa"), dropout=0.0, gradient_checkpointing=True)
    if memory:
        enable_checkpoint_offload(peft_model)
        assert enable_tiled_mlp(peft_model, 37) == 2
    install_label_only_forward(peft_model, chunk=5)  # several head chunks per sample
    peft_model.train()
    return peft_model


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_model):
    return make_tiny_model(orig_ctx=64)[1]


@pytest.fixture(scope="module")
def finetune_model(tiny_dir, one_thread):
    return _finetune_model(tiny_dir)


def _pairs(rows, i):
    """Sample i's pairs: (input_ids, labels, start) each, cut at its recorded pair boundaries."""
    ids, labels = rows.row(i)
    starts = rows.pair_starts()[i].tolist() + [len(ids)]
    return [(torch.from_numpy(ids[a:b].astype("int64")), torch.from_numpy(labels[a:b].astype("int64")), a)
            for a, b in zip(starts, starts[1:])]


def _loss_and_grads(model, **batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out["loss_sum"].backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out["loss_sum"].detach(), int(out["n_tokens"]), grads


@pytest.mark.parametrize("positions", ["reset", "continuous"])
def test_document_masked_batch_from_the_collator_equals_separate_pairs(rows, finetune_model, positions):
    """A padded batch of two packed samples from the dataset + collator under document attention: the label-only
    loss sum and every trained tensor's gradient equal those of each pair run alone (positions from 0 under reset,
    from the pair's offset in its sample under continuous), fp32, to 1e-5."""
    multi = [i for i, s in enumerate(rows.pair_starts()) if len(s) > 1][:2]
    ds = PackedDataset(rows, Policy(positions, "document"), seed=3)
    batch = Collator(pad_id=0)([ds[i] for i in multi])
    assert "attention_mask" in batch or len({len(rows.row(i)[0]) for i in multi}) == 1
    loss, n, grads = _loss_and_grads(finetune_model, **batch)
    ref_loss, ref_n, ref_grads = 0.0, 0, {}
    for i in multi:
        for ids, lab, start in _pairs(rows, i):
            off = 0 if positions == "reset" else start
            part, k, g = _loss_and_grads(finetune_model, input_ids=ids[None], labels=lab[None],
                                         position_ids=torch.arange(len(ids))[None] + off)
            ref_loss, ref_n = ref_loss + part, ref_n + k
            for name, t in g.items():
                ref_grads[name] = ref_grads.get(name, 0) + t
    assert n == ref_n > 0
    torch.testing.assert_close(loss, ref_loss, atol=1e-5 * max(1.0, float(ref_loss)), rtol=0)
    assert grads.keys() == ref_grads.keys() and len(grads) > 4
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_document_mask_under_checkpoint_offload_and_tiled_mlp(rows, tiny_dir, finetune_model, one_thread):
    """The same padded reset + document batch through a model with checkpoint offload and a tiled MLP: the loss
    sum and gradients of the plain model (one reference for the memory features, checked above against the
    separate pairs)."""
    multi = [i for i, s in enumerate(rows.pair_starts()) if len(s) > 1][:2]
    batch = Collator(pad_id=0)([PackedDataset(rows, Policy("reset", "document"))[i] for i in multi])
    mem = _finetune_model(tiny_dir, memory=True)
    mem.load_state_dict(finetune_model.state_dict())  # the same LoRA A (drawn at random when the adapter is added)
    loss, n, grads = _loss_and_grads(mem, **batch)
    ref_loss, ref_n, ref_grads = _loss_and_grads(finetune_model, **batch)
    assert n == ref_n
    torch.testing.assert_close(loss, ref_loss, atol=1e-5 * float(ref_loss), rtol=0)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_causal_batch_differs_from_separate_pairs(rows, finetune_model):
    """The check above can fail: causal attention across the pairs gives another loss."""
    i = next(i for i, s in enumerate(rows.pair_starts()) if len(s) > 1)
    batch = Collator(pad_id=0)([PackedDataset(rows)[i]])
    loss, _, _ = _loss_and_grads(finetune_model, **batch)
    ref = sum(_loss_and_grads(finetune_model, input_ids=ids[None], labels=lab[None],
                              position_ids=torch.arange(len(ids))[None] + a)[0] for ids, lab, a in _pairs(rows, i))
    assert abs(float(loss) - float(ref)) > 1e-3


def test_reset_positions_restart_at_zero_per_pair_and_pad(rows):
    ds = PackedDataset(rows, Policy("reset", "document"))
    i, j = 0, next(k for k in range(len(rows)) if len(rows.row(k)[0]) != len(rows.row(0)[0]))
    batch = Collator(pad_id=7)([ds[i], ds[j]])
    for r, idx in enumerate((i, j)):
        n = len(rows.row(idx)[0])
        starts = rows.pair_starts()[idx].tolist() + [n]
        want = np.concatenate([np.arange(b - a) for a, b in zip(starts, starts[1:])])
        seg = np.concatenate([np.full(b - a, k) for k, (a, b) in enumerate(zip(starts, starts[1:]))])
        assert batch["position_ids"][r, :n].tolist() == want.tolist()
        assert batch["segment_ids"][r, :n].tolist() == seg.tolist()
        assert batch["position_ids"][r, n:].eq(0).all() and batch["segment_ids"][r, n:].eq(PAD_SEGMENT).all()
        assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        assert batch["input_ids"][r, n:].eq(7).all() and batch["labels"][r, n:].eq(-100).all()


def test_default_policy_adds_nothing_and_causal_pose_no_segments(rows):
    assert set(PackedDataset(rows)[0]) == {"input_ids", "labels"}  # the paper's packing: the batch as before
    item = PackedDataset(rows, Policy(pose_target=4096), seed=1)[0]
    assert set(item) == {"input_ids", "labels", "position_ids"}  # causal: one segment, no T x T mask
    pos = item["position_ids"].numpy()
    assert pos[0] == 0 and np.all(np.diff(pos) >= 1) and pos[-1] < 4096


def test_pose_draws_depend_on_seed_index_epoch_only(rows):
    """What a resume relies on: a sample's PoSE ids are a function of (run seed, index, epoch), not of the order
    of reads or the dataset object."""
    pol = Policy(pose_target=4096)
    a, b = PackedDataset(rows, pol, seed=5), PackedDataset(rows, pol, seed=5)
    first = [a[i]["position_ids"] for i in range(len(rows))]
    later = [b[i]["position_ids"] for i in reversed(range(len(rows)))][::-1]
    assert all(torch.equal(x, y) for x, y in zip(first, later))
    assert any(not torch.equal(x, y) for x, y in zip(first, [PackedDataset(rows, pol, seed=6)[i]["position_ids"]
                                                             for i in range(len(rows))]))
    b.epoch = 1
    assert any(not torch.equal(x, b[i]["position_ids"]) for i, x in enumerate(first))


def test_trainer_counts_coverage_of_a_hand_made_batch():
    """LabelOnlyTrainer.count_coverage on a padded batch (row 2 has 2 pads), context 8 in 4 bins of 2 positions."""
    from ropescale.training.trainer import LabelOnlyTrainer

    tr = LabelOnlyTrainer.__new__(LabelOnlyTrainer)  # only the counting, no model
    tr.sequence_layout, tr.coverage = None, Coverage(8, bins=4)
    batch = {"input_ids": torch.zeros(2, 6, dtype=torch.long),
             "position_ids": torch.tensor([[0, 1, 2, 0, 1, 9], [0, 5, 6, 7, 0, 0]]),
             "segment_ids": torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, -1, -1]], dtype=torch.int32),
             "attention_mask": torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]]),
             "labels": torch.tensor([[-100, 5, 5, -100, -100, 5], [-100, -100, 5, 5, -100, -100]])}
    tr.count_coverage(batch)
    c = tr.coverage
    # real positions: 0 1 2 0 1 9 | 0 5 6 7 -> bins [0,2): 0 1 0 1 0 = 5, [2,4): 2, [4,6): 5, [6,8): 6 7; beyond: 9
    assert c.tokens == [5, 1, 1, 2] and c.tokens_beyond == 1
    # labelled = queries whose next token has a label: pos 0 (->5), 1 (->5), 1 (->9) | 5 (->6), 6 (->7)
    assert c.labelled == [3, 0, 1, 1] and c.labelled_beyond == 0
    assert (c.samples, c.longest, c.longest_distance) == (2, 9, 9)  # 9 - 0 in row 1's second segment (0 1 9)


def test_document_attention_on_a_set_without_boundaries_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ropescale.training.data import check_positions

    d = tmp_path / "bare"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": [[1, 2, 3]], "labels": [[-100, 2, 3]]}), d / "train.parquet")
    r = load_rows(d, boundaries=True)
    assert r.pair_starts() is None
    check_positions(r, Policy(), extended=64, allow_extrapolation=False, where=d)
    with pytest.raises(InputError, match="pair boundaries"):
        check_positions(r, Policy("continuous", "document"), extended=64, allow_extrapolation=False, where=d)
    with pytest.raises(InputError, match="extended context"):
        check_positions(r, Policy(pose_target=128), extended=64, allow_extrapolation=False, where=d)


def test_sequence_parallel_refuses_document_attention_without_sdpa():
    from types import SimpleNamespace

    from ropescale.training.sequence_parallel import check_settings

    cfg = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(InputError, match="--attention document runs with --attn sdpa only") as e:
        check_settings(2, config=cfg, world=2, deepspeed="zero2", attn="flash_attention_2",
                       policy=Policy("reset", "document"))
    assert "\n" not in str(e.value)


def test_shard_of_a_policy_batch_keeps_its_positions_and_the_whole_batch_segments():
    """shard_batch on a collated reset + document batch of 2 rows (5 and 3 tokens, K = 2: padded to 6): each rank
    gets its slice of the given position ids (padding 0), max_position their largest, and the varlen arguments of
    the whole padded batch (worked by hand)."""
    from ropescale.training.sequence_parallel import shard_batch

    batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]]),
             "labels": torch.tensor([[-100, 2, 3, -100, 5], [-100, 7, 8, -100, -100]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
             "position_ids": torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]]),
             "segment_ids": torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, -1, -1]], dtype=torch.int32)}
    a, b = (shard_batch(batch, 2, r, pad_id=0) for r in (0, 1))
    assert a["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]] and b["position_ids"].tolist() == [[0, 1, 0],
                                                                                                   [0, 0, 0]]
    assert a["max_position"] == b["max_position"] == 2
    # runs over the 2 x 6 flattened tokens: 3 | 2 | pad 1 || 3 | pad 3
    for s in (a, b):
        assert s["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 9, 12] and s["max_length_q"] == 3
        assert s["cu_seq_lens_k"] is s["cu_seq_lens_q"]
    assert a["shift_labels"].tolist() == [[2, 3, -100], [7, 8, -100]]
    assert b["shift_labels"].tolist() == [[5, -100, -100], [-100, -100, -100]]


def test_recipe_keys(tmp_path):
    from ropescale.common.settings import build
    from ropescale.training.config import TrainSettings, load_recipe
    from ropescale.training.data import policy_of

    f = tmp_path / "r.yaml"
    f.write_text("positions: reset\nattention: document\npose_target: 4096\npose_chunks: 3\n")
    s = build(TrainSettings, load_recipe(f))
    assert policy_of(s) == Policy("reset", "document", 4096, 3)
    assert policy_of(TrainSettings()).is_default  # continuous + causal, no PoSE: the paper's
    f.write_text("lr: 1.0e-3\nattention: diagonal\n")
    with pytest.raises(InputError, match="attention") as e:
        load_recipe(f)
    assert e.value.line == 2
