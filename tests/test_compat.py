"""One test per shim of ropescale/common/compat/: each checks, against the installed transformers / peft /
deepspeed / accelerate, the signature, attribute or behaviour the shim relies on, and fails with
"LIBRARY VERSION changed WHAT: see compat.SHIM" when a release changed it."""
from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import subprocess
import sys

import pytest
import torch

from ropescale.common import compat
from ropescale.common.compat import rope as rope_shims

VOCAB = 64


def changed(lib: str, what: str, shim: str) -> str:
    return f"{lib} {md.version(lib)} changed {what}: see compat.{shim}"


def tiny(arch: str = "qwen2", **kw):
    """A random 2-layer GQA model (4 query heads, 2 key/value heads) built from a config, in eval mode."""
    from ropescale.tiny.build import random_model, tiny_config

    args = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, orig_ctx=16)
    args.update(kw)
    return random_model(tiny_config(VOCAB, arch, eos_token_id=0, **args), seed=0)


IDS = torch.tensor([[5, 9, 13, 2, 40, 33, 7, 21]])


def test_version_reads_the_installed_release():
    import transformers

    assert compat.version("transformers") == tuple(int(x) for x in transformers.__version__.split(".")[:3])
    assert compat.version("no-such-distribution-here") == ()


# ---------------------------------------------------------------- config layout and dtype
def test_rope_layout_is_the_libraries_and_round_trips(tmp_path):
    from transformers import AutoConfig

    from ropescale.tiny.build import tiny_config

    cfg = tiny_config(VOCAB, "qwen2", rope_theta=12345.0)
    want = "5" if compat.version("transformers") >= (5,) else "4"
    assert compat.rope_layout(cfg) == want, changed("transformers", f"where a config keeps rope_theta (expected the "
                                                    f"{want}.x layout)", "rope_layout")
    e = compat.read_rope_entries(cfg, 10000.0, "default")
    assert (e["rope_type"], e["rope_theta"]) == ("default", 12345.0), \
        changed("transformers", f"the rope entries of a plain config ({e})", "read_rope_entries")
    compat.write_rope_entries(cfg, {"rope_type": "linear", "rope_theta": 777.0, "factor": 4.0}, 64, "default")
    cfg.save_pretrained(tmp_path)
    back = AutoConfig.from_pretrained(tmp_path)
    e = compat.read_rope_entries(back, 10000.0, "default")
    assert (e["rope_type"], e["rope_theta"], e["factor"], back.max_position_embeddings) == ("linear", 777.0, 4.0, 64), \
        changed("transformers", f"how written rope entries are saved and reloaded ({e})", "write_rope_entries")
    assert compat.rope_key(back) == ("rope_parameters" if want == "5" else "rope_scaling")


def test_a_4x_config_json_is_read_by_this_library(tmp_path):
    """Checkpoints on disk use the 4.x layout (rope_scaling with "type" + rope_theta): the library reads them into
    its own layout, and read_rope_entries gets the same entries from the loaded config and from the file."""
    from transformers import AutoConfig

    from ropescale.tiny.build import tiny_config

    d = tiny_config(VOCAB, "qwen2").to_dict()
    for k in ("rope_parameters", "rope_scaling"):
        d.pop(k, None)
    d.update(rope_theta=5000.0, rope_scaling={"type": "linear", "factor": 2.0})
    (tmp_path / "config.json").write_text(json.dumps(d))
    from_file = compat.read_rope_entries(d, 10000.0, "default")
    loaded = compat.read_rope_entries(AutoConfig.from_pretrained(tmp_path), 10000.0, "default")
    key = ("rope_type", "rope_theta", "factor")
    assert [from_file[k] for k in key] == ["linear", 5000.0, 2.0]
    assert [loaded[k] for k in key] == ["linear", 5000.0, 2.0], \
        changed("transformers", f"how a 4.x config.json's rope_scaling/rope_theta are loaded ({loaded})",
                "read_rope_entries")


def test_dtype_keyword_and_config_field(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny()
    assert compat.config_dtype(model.config) in (torch.float32, "float32")
    model.save_pretrained(tmp_path)
    m = AutoModelForCausalLM.from_pretrained(tmp_path, **compat.dtype_kwargs(torch.bfloat16))
    assert next(m.parameters()).dtype == torch.bfloat16, \
        changed("transformers", "the from_pretrained keyword for the dtype", "dtype_kwargs")
    assert compat.config_dtype(m.config) == torch.bfloat16, \
        changed("transformers", "the config field holding the dtype", "config_dtype")
    compat.set_config_dtype(m.config, "float16")
    assert compat.config_dtype(m.config) in (torch.float16, "float16"), \
        changed("transformers", "the config field holding the dtype", "set_config_dtype")


# ---------------------------------------------------------------- forward, attention, cache
def test_last_logits_kwargs_keep_only_the_last_positions():
    model = tiny()
    with torch.no_grad():
        full = model(input_ids=IDS).logits
        last = model(input_ids=IDS, **compat.last_logits_kwargs(2)).logits
    assert last.shape[1] == 2, changed("transformers", "the keyword for logits of the last positions only",
                                       "last_logits_kwargs")
    assert torch.allclose(last, full[:, -2:], atol=1e-5)


def test_cache_argument_and_output_field_are_the_forwards_own():
    """The name the forward takes the KV cache by (and the outputs carry it under) is a parameter of the forward
    itself, not an alias it warns about; a decode step through it continues the prefix exactly."""
    model = tiny()
    name = compat.cache_name()
    assert name in inspect.signature(type(model).forward).parameters, changed(
        "transformers", "the forward's cache argument", "cache_kwargs")
    with torch.no_grad():
        full = model(input_ids=IDS).logits
        first = model(input_ids=IDS[:, :-1], use_cache=True)
        cache = compat.output_cache(first)
        assert cache is not None, changed("transformers", "the outputs' cache field", "output_cache")
        step = model(input_ids=IDS[:, -1:], **compat.cache_kwargs(cache), use_cache=True).logits
    assert torch.allclose(step[0, -1], full[0, -1], atol=1e-5)


def test_registered_attention_runs_in_every_layer_while_selected():
    model = tiny()
    calls = []
    sdpa = compat.sdpa_attention()
    names = list(inspect.signature(sdpa).parameters)[:8]
    assert names == ["module", "query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal"], \
        changed("transformers", f"the attention function signature ({names})", "sdpa_attention")

    def spy(module, query, key, value, attention_mask, **kw):
        calls.append((tuple(query.shape), tuple(key.shape)))
        return sdpa(module, query, key, value, attention_mask, **kw)

    compat.register_attention("ropescale_compat_spy", spy)
    with torch.no_grad():
        ref = model(input_ids=IDS).logits
        with compat.using_attention(model.config, "ropescale_compat_spy"):
            got = model(input_ids=IDS).logits
        after = model(input_ids=IDS).logits
    assert len(calls) == 2, changed("transformers", "how attention functions are registered or selected "
                                    "(config._attn_implementation)", "register_attention / using_attention")
    assert calls[0] == ((1, 4, 8, 8), (1, 2, 8, 8)), \
        changed("transformers", f"the q/k shapes an attention function gets ({calls[0]})", "register_attention")
    assert torch.allclose(got, ref, atol=1e-5) and torch.equal(after, ref)
    assert compat.attn_implementation(model.config) == "sdpa" and len(calls) == 2


def test_duck_cache_with_a_prepared_mask_decodes_as_the_full_forward():
    """What the slot decoder relies on: a step with an object cache and a prepared 4D additive mask; every layer
    calls update(key, value, layer_idx, ...) once and attends to what it returns."""
    why = compat.prepared_mask_blocker()
    if why:  # 4.x: the slot decoder is not used (the backend says why); nothing else to check
        assert "5.x" in why
        return

    class Growing(compat.DuckCache):
        def __init__(self):
            self.k, self.v, self.calls = {}, {}, []

        def write(self, key, value, layer_idx):
            self.calls.append(layer_idx)
            self.k[layer_idx] = key if layer_idx not in self.k else torch.cat([self.k[layer_idx], key], 2)
            self.v[layer_idx] = value if layer_idx not in self.v else torch.cat([self.v[layer_idx], value], 2)
            return self.k[layer_idx], self.v[layer_idx]

    model = tiny()
    cache = Growing()
    n = IDS.shape[1]
    with torch.no_grad():
        ref = model(input_ids=IDS).logits[0]
        got = []
        for t in range(n):
            mask = torch.zeros((1, 1, 1, t + 1))
            out = model(input_ids=IDS[:, t:t + 1], position_ids=torch.tensor([[t]]), attention_mask=mask,
                        past_key_values=cache, use_cache=True)
            got.append(out.logits[0, -1])
    assert cache.calls == [0, 1] * n, \
        changed("transformers", f"how attention layers call the cache ({cache.calls[:6]})", "DuckCache")
    assert torch.allclose(torch.stack(got), ref, atol=1e-4), \
        changed("transformers", "the use of a prepared 4D mask or of the (key, value) the cache returns",
                "DuckCache / prepared_mask_blocker")


def test_writer_cache_sees_every_layer_and_is_empty_to_the_model():
    model = tiny()
    seen = []
    with torch.no_grad():
        ref = model(input_ids=IDS, use_cache=False).logits
        w = compat.writer_cache(model.config, lambda k, v, i: seen.append((i, tuple(k.shape), tuple(v.shape))))
        got = model(input_ids=IDS, past_key_values=w, use_cache=True).logits
    assert seen == [(0, (1, 2, 8, 8), (1, 2, 8, 8)), (1, (1, 2, 8, 8), (1, 2, 8, 8))], \
        changed("transformers", f"DynamicCache.update calls ({seen})", "writer_cache")
    assert torch.allclose(got, ref, atol=1e-5) and w.get_seq_length() == 0, \
        changed("transformers", "DynamicCache (an overridden update no longer keeps it empty)", "writer_cache")


def test_dynamic_ntk_rotary_internals():
    from ropescale.common.compat import read_rope_entries, write_rope_entries
    from ropescale.tiny.build import random_model, tiny_config

    cfg = tiny_config(VOCAB, "qwen2", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                      orig_ctx=16, eos_token_id=0)
    write_rope_entries(cfg, {**read_rope_entries(cfg, 10000.0, "default"), "rope_type": "dynamic", "factor": 4.0}, 16,
                       "default")
    model = random_model(cfg)
    mods = rope_shims.dynamic_rope_modules(model)
    assert len(mods) == 1, changed("transformers", "the dynamic-NTK rotary module's attributes (rope_type, "
                                   "original_inv_freq, original_max_seq_len)", "rope.dynamic_rope_modules")
    m = mods[0]
    orig = m.original_inv_freq.clone()
    ids = torch.randint(1, VOCAB, (1, 40))
    with torch.no_grad():
        model(input_ids=ids)
    inv, seen, scaling = rope_shims.rope_frequencies(m)
    # the frequencies of the longest input; 5.0.x never updates max_seq_len_cached (it stays 16): harmless here
    assert seen in (16, 40) and not torch.allclose(inv, orig), \
        changed("transformers", f"the dynamic update (max_seq_len_cached {seen} / inv_freq after a long input)",
                "rope.rope_frequencies")
    want_inv, want_scaling = rope_shims.rope_frequencies_for_length(m, torch.device("cpu"), 40)
    assert torch.allclose(want_inv, inv) and want_scaling == scaling, \
        changed("transformers", "ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=)",
                "rope.rope_frequencies_for_length")
    # the undecorated forward uses the frequencies it is given, and does not update them
    x = torch.zeros(1, 3, 32)
    pos = torch.tensor([[37, 38, 39]])
    with torch.no_grad():
        cos_ref, sin_ref = m(x, pos)
        rope_shims.set_rope_frequencies(m, orig.clone(), 1.0)
        raw = rope_shims.undecorated_rope_forward(m)
        cos_o, _ = raw(m, x, pos)
        rope_shims.set_rope_frequencies(m, inv, scaling)
        cos_n, sin_n = raw(m, x, pos)
    assert not torch.allclose(cos_o, cos_ref) and torch.allclose(cos_n, cos_ref) and torch.allclose(sin_n, sin_ref), \
        changed("transformers", "the rotary forward / its dynamic_rope_update decorator",
                "rope.undecorated_rope_forward")
    rope_shims.reset_dynamic_rope([m])
    assert torch.equal(m.inv_freq, orig) and m.max_seq_len_cached == m.original_max_seq_len == 16


def test_length_rule_and_longrope_rotary_internals():
    """compat.rope.install_length_rope (a subclass of the model's rotary class whose forward takes its frequencies from
    the rule at max(position_ids) + 1), and the longrope module's factor sets."""
    from ropescale.common.compat import read_rope_entries, write_rope_entries
    from ropescale.tiny.build import random_model, tiny_config

    model = tiny()
    mods = rope_shims.rotary_modules(model)
    assert len(mods) == 1, changed("transformers", "the rotary module's attributes (rope_type, inv_freq, "
                                   "attention_scaling)", "rope.rotary_modules")
    m = mods[0]
    cls = type(m)
    seen = []

    def rule(n):
        seen.append(n)
        return [1.0 / (n * (i + 1)) for i in range(4)], 1.5  # 4 pairs: head_dim 8

    assert rope_shims.install_length_rope(model, rule) == 1 and rope_shims.length_rope_modules(model) == [m]
    assert isinstance(m, cls) and rope_shims.undecorated_rope_forward(m) is inspect.unwrap(cls.forward)
    x = torch.zeros(1, 3, 32)
    with torch.no_grad():
        cos, _ = m(x, torch.tensor([[4, 5, 6]]))
        model(input_ids=IDS)  # 8 positions: the model's own forward goes through the rule too
    want = torch.tensor([4.0, 5.0, 6.0])[:, None] * torch.tensor([1 / (7 * (i + 1)) for i in range(4)])[None]
    assert torch.allclose(cos[0], torch.cat([want, want], -1).cos() * 1.5, atol=1e-6) and seen == [7, 8], \
        changed("transformers", "the rotary forward (cos/sin from inv_freq and attention_scaling)",
                "rope.install_length_rope")
    cfg = tiny_config(VOCAB, "qwen2", hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64,
                      orig_ctx=16, eos_token_id=0)
    e = {**read_rope_entries(cfg, 10000.0, "default"), "rope_type": "longrope", "factor": 4.0,
         "original_max_position_embeddings": 16, "short_factor": [1.0, 1.0, 1.0, 1.0],
         "long_factor": [1.0, 2.0, 3.0, 4.0]}
    write_rope_entries(cfg, e, 64, "default")
    lm = rope_shims.rotary_modules_of_type(random_model(cfg), "longrope")
    assert len(lm) == 1 and rope_shims.longrope_original_context(lm[0]) == 16, \
        changed("transformers", "the longrope module / rope_parameters['original_max_position_embeddings']",
                "rope.longrope_original_context")
    (s_inv, s_att), (l_inv, l_att) = (rope_shims.longrope_frequencies(lm[0], "cpu", long) for long in (False, True))
    assert torch.allclose(s_inv / l_inv, torch.tensor(e["long_factor"])) and s_att == l_att, \
        changed("transformers", "ROPE_INIT_FUNCTIONS['longrope'](config, device, seq_len=)",
                "rope.longrope_frequencies")


def rope_by_hand(pos: list[int], inv: list[float], att: float):
    """cos, sin of RoPE at positions ``pos`` with inverse frequencies ``inv`` (Su et al. 2021, Eq. 34: angle p x
    theta_i, each pair's angle twice, as transformers lays cos/sin out), times the attention factor ``att``."""
    ang = torch.tensor(pos, dtype=torch.float64)[:, None] * torch.tensor(inv, dtype=torch.float64)[None]
    ang = torch.cat([ang, ang], -1)
    return (ang.cos() * att).float(), (ang.sin() * att).float()


def test_one_wrapper_runs_each_rule_and_puts_the_module_back():
    """compat.rope.wrap_rotary: a wrapped module with no rule computes what its class computes; rope_forward /
    fixed_rope / per_row_forward (the slot decoder's) and global_length (sequence parallelism's) run inside their
    blocks only, nested ones restore the outer one, and each gives RoPE at the frequencies it was given."""
    model = tiny()
    m = rope_shims.rotary_modules(model)[0]
    inv0, att0 = m.inv_freq.clone(), m.attention_scaling
    x, pos = torch.zeros(2, 3, 32), torch.tensor([[0, 1, 2], [7, 8, 9]])
    with torch.no_grad():
        ref = m(x, pos)
        assert rope_shims.rope_rules(m) is None and rope_shims.wrap_rotary(m) is rope_shims.wrap_rotary(m)
        got = m(x, pos)
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), \
            changed("transformers", "the rotary forward (a subclass of its class computes another cos/sin)",
                    "rope.wrap_rotary")
        a = [1.0, 0.5, 0.25, 0.125]
        b = [0.3, 0.2, 0.1, 0.05]
        with rope_shims.fixed_rope(m, torch.tensor(a), 2.0):
            cos, sin = m(x[:1], torch.tensor([[4, 5, 6]]))
            want = rope_by_hand([4, 5, 6], a, 2.0)
            assert torch.allclose(cos[0], want[0], atol=1e-6) and torch.allclose(sin[0], want[1], atol=1e-6)
            per = rope_shims.per_row_forward(m, lambda r, n, dev: (torch.tensor([a, b][r]), 1.0 + r + n / 100))
            with rope_shims.rope_forward(m, per):  # row 0 at length 3, row 1 at length 10
                cos, sin = m(x, pos)
            for r, (f, att) in enumerate(((a, 1.03), (b, 2.10))):
                want = rope_by_hand(pos[r].tolist(), f, att)
                assert torch.allclose(cos[r], want[0], atol=1e-6) and torch.allclose(sin[r], want[1], atol=1e-6)
            cos, _ = m(x[:1], torch.tensor([[1, 2, 3]]))  # the outer rule again
            assert torch.allclose(cos[0], rope_by_hand([1, 2, 3], a, 2.0)[0], atol=1e-6)
        assert torch.equal(m.inv_freq, inv0) and m.attention_scaling == att0
        assert all(torch.equal(a_, b_) for a_, b_ in zip(m(x, pos), ref))
        # the whole sample's length: only on a module under install_global_length, only inside the block
        seen = []
        rope_shims.install_length_rope(model, lambda n: (seen.append(n), ([1.0 / n] * 4, 1.0))[1])
        with rope_shims.global_length([m], 99):
            m(x[:1], pos[:1])
        assert rope_shims.install_global_length([m]) == 1
        with rope_shims.global_length([m], 99):
            cos, _ = m(x[:1], pos[:1])
        after, _ = m(x[:1], pos[:1])
        assert seen == [3, 100] and cos.shape == (1, 3, 8)  # each length's frequencies computed once
        assert torch.allclose(cos[0], rope_by_hand([0, 1, 2], [0.01] * 4, 1.0)[0], atol=1e-6)
        assert torch.allclose(after[0], rope_by_hand([0, 1, 2], [1 / 3] * 4, 1.0)[0], atol=1e-6)


def test_checkpoint_function_is_called_once_per_layer():
    from torch.utils.checkpoint import checkpoint

    model = tiny()
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = compat.checkpointed_modules(model)  # the decoder layers (and in 5.x the decoder too, unused)
    assert sum(type(m).__name__.endswith("DecoderLayer") for m in layers) == 2, \
        changed("transformers", "which modules carry gradient_checkpointing=True", "checkpointed_modules")
    calls = []

    def fn(function, *args, **kw):
        calls.append(1)
        return checkpoint(function, *args, use_reentrant=False, **kw)

    for m in layers:
        compat.set_checkpoint_function(m, fn)
    model(input_ids=IDS).logits.sum().backward()
    assert len(calls) == 2, changed("transformers", "how checkpointed layers call _gradient_checkpointing_func",
                                    "set_checkpoint_function")


def test_text_config_is_the_decoder_config():
    model = tiny()
    assert compat.text_config(model.config).hidden_size == 32


# ---------------------------------------------------------------- Trainer
class _Sq(torch.nn.Module):
    """loss_sum = sum over labelled positions of (w x)^2."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0]))

    def forward(self, x=None, labels=None, **_):
        m = labels != -100
        return {"loss_sum": ((self.w * x) ** 2 * m).sum()}


def test_trainer_takes_token_sums_gives_the_token_mean_of_the_step(tmp_path):
    """Two micro-batches (3 and 1 labelled tokens) accumulated into one SGD step (lr 1): with
    trainer_takes_token_sums the update is the gradient of the token mean over the whole step (not halved by the
    accumulation steps), and on_save runs after checkpoint-N is on disk."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    sig = inspect.signature(Trainer.compute_loss).parameters
    assert "num_items_in_batch" in sig, changed("transformers", "Trainer.compute_loss's signature",
                                                "trainer_takes_token_sums")
    xs = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 0.5, 0.5])]
    labels = [torch.tensor([1, 1, 1]), torch.tensor([1, -100, -100])]
    rows = [{"x": x, "labels": y} for x, y in zip(xs, labels)]

    class T(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            compat.trainer_takes_token_sums(self)
            self.seen = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.seen.append(num_items_in_batch)
            out = model(**inputs)
            if num_items_in_batch is None:  # what LabelOnlyTrainer does then: the micro-batch's token mean
                return out["loss_sum"] / (inputs["labels"] != -100).sum()
            return out["loss_sum"] / num_items_in_batch * compat.token_mean_world_factor(self)

    saved = []

    class OnSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            saved.append((tmp_path / f"checkpoint-{state.global_step}").is_dir())

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=2,
                             max_steps=1, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant",
                             warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, report_to=[], use_cpu=True,
                             save_strategy="steps", save_steps=1, logging_strategy="no", remove_unused_columns=False,
                             disable_tqdm=True, save_only_model=True)
    model = _Sq()
    collate = lambda b: {k: torch.stack([r[k] for r in b]) for k in b[0]}  # noqa: E731
    tr = T(model=model, args=args, train_dataset=rows, data_collator=collate, callbacks=[OnSave()])
    assert any(isinstance(cb, compat.stdout_callbacks()) for cb in tr.callback_handler.callbacks), \
        changed("transformers", "the Trainer's default printing callbacks", "stdout_callbacks")
    tr.train()
    n = sum(int((y != -100).sum()) for y in labels)
    grad = sum(float((2 * x ** 2 * (y != -100)).sum()) for x, y in zip(xs, labels)) / n  # d/dw at w = 1
    assert [s if s is None else int(s) for s in tr.seen] == [n, n], \
        changed("transformers", f"num_items_in_batch ({tr.seen})", "trainer_takes_token_sums")
    assert model.w.item() == pytest.approx(1.0 - grad, rel=1e-5), \
        changed("transformers", f"the Trainer's loss scaling under gradient accumulation (w {model.w.item():.5f}, "
                f"token mean expects {1.0 - grad:.5f})", "trainer_takes_token_sums / token_mean_world_factor")
    assert saved == [True], changed("transformers", "when TrainerCallback.on_save runs", "ExportCallback")


# ---------------------------------------------------------------- peft
def test_peft_names_dtype_and_load_result():
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    model = tiny().to(torch.bfloat16)
    pm = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]), **compat.peft_keep_dtype())
    trained = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    assert trained and all(n.startswith(compat.PEFT_PREFIX) for n, _ in trained), \
        changed("peft", f"the names of a PeftModel's parameters ({trained[0][0]})", "PEFT_PREFIX")
    assert all(p.dtype == torch.bfloat16 for _, p in trained), \
        changed("peft", "autocast_adapter_dtype (adapters not in the model's dtype)", "peft_keep_dtype")
    state = get_peft_model_state_dict(pm)
    bogus = next(iter(state)).replace("layers.0", "layers.7")
    res = set_peft_model_state_dict(pm, {**state, bogus: next(iter(state.values()))})
    unexpected = compat.peft_unexpected_keys(res)
    assert len(unexpected) == 1 and "layers.7" in unexpected[0], \
        changed("peft", f"what set_peft_model_state_dict returns ({res!r:.200})", "peft_unexpected_keys")


# ---------------------------------------------------------------- deepspeed, accelerate, logging
DS_SCRIPT = r"""
import importlib, inspect, json, logging, sys
import torch, deepspeed
dct = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm.torch as an attribute is torch itself)
from ropescale.common import compat
out = {"stdout_loggers": sorted(n for n, lg in logging.root.manager.loggerDict.items()
                                if isinstance(lg, logging.Logger)
                                and any(getattr(h, "stream", None) is sys.stdout for h in lg.handlers))}
out["shm_called_in_backend"] = "build_shm_op()" in inspect.getsource(dct.TorchBackend.__init__)
out["shm_disabled"] = compat.disable_deepspeed_shm_op() and dct.build_shm_op() is None
import deepspeed.runtime.zero.stage3 as s3
out["grad_ready_read"] = "ds_grad_is_ready" in inspect.getsource(s3)
deepspeed.init_distributed(dist_backend="gloo")
cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
with deepspeed.zero.Init(config_dict_or_path=cfg):
    lin = torch.nn.Linear(6, 5, bias=False)
p = lin.weight
out["zero3"] = compat.is_zero3_param(p)
out["numel"] = [compat.param_numel(p), p.numel()]
with compat.zero3_gathered([p], modifier_rank=0):
    out["gathered_numel"] = p.numel()
    p.data.fill_(2.0)
with compat.zero3_gathered([p], modifier_rank=None):
    out["kept"] = float(p.sum())
out["plain"] = [compat.is_zero3_param(torch.nn.Parameter(torch.ones(3))), compat.param_numel(torch.ones(3))]
print(json.dumps(out), flush=True)
# the gloo group torn down before the interpreter exits: left to exit, its threads can abort the process
# ("terminate called without an active exception", exit -6) after the result is printed
torch.distributed.destroy_process_group()
"""


def test_deepspeed_zero3_marks_gathering_shm_op_and_stdout_logger(tmp_path):
    from ft_helpers import ROOT, run_env

    script = tmp_path / "ds.py"
    script.write_text(DS_SCRIPT)
    env = run_env()
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + (hash(str(tmp_path)) % 2000)))
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["zero3"] and out["numel"][0] == 30 and out["numel"][1] < 30, \
        changed("deepspeed", f"how ZeRO-3 marks partitioned parameters ({out['numel']})",
                "is_zero3_param / param_numel")
    assert out["gathered_numel"] == 30 and out["kept"] == 60.0, \
        changed("deepspeed", "GatheredParameters(params, modifier_rank=)", "zero3_gathered")
    assert out["plain"] == [False, 3]
    assert out["grad_ready_read"], changed("deepspeed", "ZeRO-3 no longer reads param.ds_grad_is_ready",
                                           "defer_zero3_reduce")
    assert out["shm_called_in_backend"] and out["shm_disabled"], \
        changed("deepspeed", "how the torch comm backend builds its shm op", "disable_deepspeed_shm_op")
    assert out["stdout_loggers"] and set(out["stdout_loggers"]) <= set(compat.STDOUT_LOGGERS), \
        changed("deepspeed", f"the loggers that write to stdout ({out['stdout_loggers']})", "STDOUT_LOGGERS")


def test_the_accelerate_warning_we_filter_still_exists():
    import accelerate.state

    msg = compat.QUIET_WARNINGS[-1][1]
    assert msg in inspect.getsource(accelerate.state), \
        changed("accelerate", f"the text of the {msg!r} warning", "QUIET_WARNINGS")


def test_agree_grad_accum_meets_what_accelerate_checks():
    """The Trainer still builds its Accelerator with 1 accumulation step (so accelerate compares it with DeepSpeed's
    value and warns), and agree_grad_accum sets the value accelerate compares. The end-to-end check (no warning in
    a ZeRO-3 run with 4 accumulation steps) is tests/test_finetune_default.py."""
    from accelerate import Accelerator
    from transformers import Trainer

    from ropescale.common.compat import agree_grad_accum

    src = inspect.getsource(Trainer.create_accelerator_and_postprocess)
    assert 'grad_acc_kwargs["num_steps"] = 1' in src, changed("transformers", "how the Trainer sets accelerate's "
                                                              "gradient accumulation", "agree_grad_accum")
    prep = inspect.getsource(Accelerator._prepare_deepspeed)
    assert "self.gradient_accumulation_steps" in prep, changed("accelerate", "what _prepare_deepspeed compares",
                                                                "agree_grad_accum")

    class Fake:
        is_deepspeed_enabled = True

        class args:
            gradient_accumulation_steps = 4

        accelerator = Accelerator(cpu=True)

    agree_grad_accum(Fake)
    assert Fake.accelerator.gradient_accumulation_steps == 4


def test_warmup_schedules_start_at_zero_and_the_trainer_builds_them_with_create_scheduler():
    """What warmup_from_first_step relies on: transformers' warm-up schedules are a torch LambdaLR whose multiplier is 0
    at step 0 (the first optimizer step would run at learning rate 0), with ``lr_lambdas``; the Trainer (also under
    DeepSpeed) makes its scheduler through ``create_scheduler``. The shifted schedule's values: test_second_hour."""
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import Trainer, get_scheduler
    from transformers.integrations import deepspeed as hf_ds

    for kind in ("constant_with_warmup", "linear", "cosine"):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        sched = get_scheduler(kind, opt, num_warmup_steps=4, num_training_steps=10)
        assert type(sched) is LambdaLR and sched.lr_lambdas[0](0) == 0.0, \
            changed("transformers", f"the {kind} warm-up schedule", "warmup_from_first_step")
        shifted = compat.warmup_from_first_step(sched, 4)
        assert shifted.optimizer is opt and opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 4)
    assert "self.lr_scheduler = get_scheduler(" in inspect.getsource(Trainer.create_scheduler) and \
        ".create_scheduler(" in inspect.getsource(hf_ds.deepspeed_optim_sched), \
        changed("transformers", "where the Trainer builds its scheduler", "warmup_from_first_step")
