"""The label-only loss (ropescale.training.loss) against transformers' own full-logits causal-LM loss."""
from __future__ import annotations

import torch

from ropescale.training.loss import head_loss_sum, install_label_only_forward, label_only_loss
from ropescale.training.model import add_lora


def _batch(vocab, B=2, T=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    labels[0, 10:20] = ids[0, 10:20]  # a labelled span in each row, different places
    labels[1, 30:47] = ids[1, 30:47]
    labels[1, 5] = ids[1, 5]
    return ids, labels


def test_label_only_loss_equals_hf_full_logits_loss(make_tiny_model):
    model, _ = make_tiny_model(save=False)
    ids, labels = _batch(model.config.vocab_size)
    ref = model(input_ids=ids, labels=labels).loss  # HF ForCausalLMLoss over full logits (independent)
    ours = label_only_loss(model, ids, labels)
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-6), (ours, ref)
    # chunked head (logits recomputed in backward) gives the same value and the same gradients
    model.zero_grad()
    ref.backward()
    g_ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    chunked = label_only_loss(model, ids, labels, chunk=4)
    chunked.backward()
    assert torch.allclose(chunked, ref.detach(), rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, g_ref[n], rtol=1e-4, atol=1e-6), n


def test_head_sees_only_labelled_positions(make_tiny_model):
    model, _ = make_tiny_model(save=False)
    ids, labels = _batch(model.config.vocab_size)
    rows = []
    h = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(tuple(o.shape)))
    try:
        s, n = head_loss_sum(model.lm_head, model.model(input_ids=ids).last_hidden_state, labels, chunk=1 << 20)
    finally:
        h.remove()
    expected = int((labels[:, 1:] != -100).sum())  # by hand: 10 + 17 + 1 labelled tokens (none at position 0)
    assert n == expected == 28
    assert rows == [(expected, model.config.vocab_size)]  # never (B, T, V)


def test_no_labels_gives_zero_with_graph(make_tiny_model):
    model, _ = make_tiny_model(save=False)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    s, n = head_loss_sum(model.lm_head, model.model(input_ids=ids).last_hidden_state, torch.full_like(ids, -100))
    assert n == 0 and float(s.detach()) == 0.0 and s.requires_grad


def test_installed_forward_on_peft_model_matches_reference(make_tiny_model):
    model, _ = make_tiny_model(save=False)
    peft_model, extra = add_lora(model, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False)
    assert "model.embed_tokens.weight" in extra and "model.norm.weight" in extra
    assert sum("layernorm" in n for n in extra) == 2 * model.config.num_hidden_layers
    ids, labels = _batch(model.config.vocab_size, seed=3)
    with torch.no_grad():
        ref = peft_model(input_ids=ids, labels=labels).loss  # PEFT forward -> HF loss, full logits
    install_label_only_forward(peft_model, chunk=8)
    with torch.no_grad():
        out = peft_model(input_ids=ids, labels=labels)
    assert int(out["n_tokens"]) == int((labels[:, 1:] != -100).sum())
    assert torch.allclose(out["loss_sum"] / out["n_tokens"], ref, rtol=1e-5, atol=1e-6)


def test_packed_dataset_matches_data_concat_rows(tmp_path, chapters, tiny_tokenizer_dir):
    from ft_helpers import packed

    from data_concat import load_packed
    from ropescale.training.data import PackedDataset, check_rows, load_rows

    d = packed(chapters, tiny_tokenizer_dir, tmp_path / "p", 300, 480, n=12)
    ref = load_packed(d)  # data_concat's own reader: the reference
    arrays = load_rows(d)
    ds = PackedDataset(arrays)
    assert len(ds) == len(ref)
    for i, r in enumerate(ref):
        assert ds[i]["input_ids"].tolist() == r["input_ids"] and ds[i]["labels"].tolist() == r["labels"]
    st = check_rows(arrays, vocab_size=10**6, extended=10**6, allow_extrapolation=False, where=d, rope_desc="x")
    assert st["max"] == max(r["length"] for r in ref) and st["samples"] == len(ref)
    assert st["supervised"] == sum(sum(x != -100 for x in r["labels"]) for r in ref)
