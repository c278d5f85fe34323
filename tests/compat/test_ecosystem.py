"""The torch_npu API that libraries call when they detect an NPU adapter:
npu_fusion_attention, torch_npu.optim.NpuFusedAdamW, torch.npu.amp.GradScaler,
and transformers' own NPU code path (where transformers is installed)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu

TOL = dict(rtol=1e-5, atol=1e-5)


def reference_attention(q, k, v, keep=None, scale=None, pse=None):
    """BNSD attention on the cpu, spelled out as Ascend documents npu_fusion_attention:
    softmax(scale * (q k^T + pse)) v."""
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), 1)
        v = v.repeat_interleave(q.size(1) // v.size(1), 1)
    scores = q @ k.transpose(-2, -1)
    if pse is not None:
        scores = scores + pse
    scores = scores * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(-1) @ v


def to_layout(t, layout):
    b, n, s, d = t.shape
    return {"BNSD": t, "BSND": t.transpose(1, 2), "BSH": t.transpose(1, 2).reshape(b, s, n * d),
            "SBH": t.permute(2, 0, 1, 3).reshape(s, b, n * d)}[layout]


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
@pytest.mark.parametrize("sparse_mode", [0, 2, 3])
def test_fusion_attention_matches_composition(layout, sparse_mode):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, requires_grad=True)  # grouped-query: 2 key/value heads
    v = torch.randn(2, 2, 7, 8, requires_grad=True)
    scale = 1 / math.sqrt(8)
    if sparse_mode == 0:
        atten_mask = torch.rand(5, 7) > 0.7
        atten_mask[:, 0] = False  # every query sees a key
        keep = ~atten_mask
    else:
        atten_mask = torch.triu(torch.ones(2048, 2048), diagonal=1).bool()  # transformers' compressed mask
        keep = torch.ones(5, 7, dtype=torch.bool).tril(0 if sparse_mode == 2 else 2)
    expected = to_layout(reference_attention(q, k, v, keep, scale), layout)
    qn, kn, vn = (t.detach().npu().requires_grad_() for t in (q, k, v))
    out = torch_npu.npu_fusion_attention(to_layout(qn, layout), to_layout(kn, layout), to_layout(vn, layout), 4,
                                         layout, atten_mask=atten_mask.npu(), scale=scale, sparse_mode=sparse_mode)
    assert len(out) == 7 and out[0].device.type == "npu"
    torch.testing.assert_close(out[0].cpu(), expected.detach(), **TOL)
    expected.square().sum().backward()
    out[0].square().sum().backward()
    for mine, theirs in ((qn, q), (kn, k), (vn, v)):
        torch.testing.assert_close(mine.grad.cpu(), theirs.grad, **TOL)


def test_fusion_attention_softmax_statistics_reproduce_the_softmax():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    out, softmax_max, softmax_sum, softmax_out, *_ = torch_npu.npu_fusion_attention(
        q.npu(), k.npu(), v.npu(), 2, "BNSD", scale=0.5)
    assert softmax_max.shape == (1, 2, 4, 8) and softmax_out.numel() == 0
    scores = q @ k.transpose(-2, -1) * 0.5
    probs = torch.exp(scores - softmax_max[..., :1].cpu()) / softmax_sum[..., :1].cpu()
    torch.testing.assert_close(probs, scores.softmax(-1), **TOL)


def test_fusion_attention_pse_and_varlen():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    pse = torch.randn(1, 2, 6, 6)
    out = torch_npu.npu_fusion_attention(q.npu(), k.npu(), v.npu(), 2, "BNSD", pse=pse.npu(), scale=0.5)[0]
    torch.testing.assert_close(out.cpu(), reference_attention(q, k, v, scale=0.5, pse=pse), **TOL)
    # TND: two sequences of 2 and 4 tokens packed along T, causal.
    t_q = torch.randn(6, 2, 4)
    out = torch_npu.npu_fusion_attention(t_q.npu(), t_q.npu(), t_q.npu(), 2, "TND", scale=0.5, sparse_mode=3,
                                         actual_seq_qlen=(2, 6), actual_seq_kvlen=(2, 6))[0]
    for begin, end in ((0, 2), (2, 6)):
        seq = t_q[begin:end].transpose(0, 1).unsqueeze(0)
        keep = torch.ones(end - begin, end - begin, dtype=torch.bool).tril()
        expected = reference_attention(seq, seq, seq, keep, 0.5).squeeze(0).transpose(0, 1)
        torch.testing.assert_close(out[begin:end].cpu(), expected, **TOL)


def test_fusion_attention_rejects_what_it_does_not_support():
    q = torch.randn(1, 2, 4, 8).npu()
    with pytest.raises(ValueError, match="input_layout"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "NSD")
    with pytest.raises(ValueError, match="sparse_mode 5"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", sparse_mode=5)
    with pytest.raises(ValueError, match="TND.*actual_seq_qlen"):
        torch_npu.npu_fusion_attention(q[0], q[0], q[0], 2, "TND")


def test_npu_fused_adamw_matches_adamw():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    npu_model = copy.deepcopy(model).npu()
    ref = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    fused = torch_npu.optim.NpuFusedAdamW(npu_model.parameters(), lr=0.05, weight_decay=0.1)
    assert fused.defaults["fused"]
    for _ in range(3):
        x = torch.randn(4, 6)
        for m, opt, dev in ((model, ref, "cpu"), (npu_model, fused, "npu")):
            opt.zero_grad()
            m(x.to(dev)).square().sum().backward()
            opt.step()
    for p, q in zip(model.parameters(), npu_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **TOL)


def test_npu_amp_grad_scaler_skips_inf_steps():
    p = torch.nn.Parameter(torch.ones(3, device="npu"))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.npu.amp.GradScaler(init_scale=8.0)
    scaler.scale((p * 2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(p.detach().cpu(), torch.full((3,), 0.8))
    opt.zero_grad()
    p.grad = torch.full((3,), float("inf"), device="npu")
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(p.detach().cpu(), torch.full((3,), 0.8))  # the step was skipped
    assert scaler.get_scale() == 4.0


def test_transformers_llama_npu_attention_path_matches_cpu():
    transformers = pytest.importorskip("transformers")
    assert transformers.utils.is_torch_npu_available()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    cpu = transformers.LlamaForCausalLM(config)
    npu_config = copy.deepcopy(config)
    npu_config._attn_implementation = "flash_attention_2"  # transformers' NPU path: npu_fusion_attention
    npu = transformers.LlamaForCausalLM(npu_config)
    npu.load_state_dict(cpu.state_dict())
    npu = npu.npu()
    ids = torch.randint(0, 101, (2, 9))
    expected, actual = cpu(input_ids=ids, labels=ids), npu(input_ids=ids.npu(), labels=ids.npu())
    torch.testing.assert_close(actual.logits.cpu(), expected.logits, **TOL)
    expected.loss.backward()
    actual.loss.backward()
    for (name, p), q in zip(cpu.named_parameters(), npu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name, **TOL)
    prompt = ids[:1, :4]
    assert torch.equal(npu.generate(prompt.npu(), max_new_tokens=5, do_sample=False).cpu(),
                       cpu.generate(prompt, max_new_tokens=5, do_sample=False))
    # transformers caches a 2048x2048 causal mask per device; later tests count live npu memory.
    from transformers.integrations import npu_flash_attention

    npu_flash_attention.ATTN_MASK_NPU_CACHE.clear()



@pytest.mark.parametrize("sparse_mode", [3, 2])
def test_transformers_npu_flash_attention_bsnd_and_varlen_tnd_match_sdpa_on_the_cpu(monkeypatch, sparse_mode):
    """transformers' integrations/npu_flash_attention.py in a tiny Llama: a padded batch takes its
    varlen path (layout TND, actual_seq_qlen/kvlen from the unpadded rows), an unpadded one the
    BSND path; both causal with the compressed mask and sparse_mode NPU_FA2_SPARSE_MODE (3, the
    default, or 2), against the same model with sdpa on the cpu, forward, backward and greedy decoding."""
    transformers = pytest.importorskip("transformers")
    from transformers.integrations import flash_attention, npu_flash_attention

    # NPU_FA2_SPARSE_MODE is read when these modules are imported: what it sets there is set here
    # (with 2, top-left causal, transformers drops causality for a single query: decoding).
    monkeypatch.setattr(npu_flash_attention, "SPARSE_MODE", sparse_mode)
    monkeypatch.setattr(flash_attention, "_use_top_left_mask", sparse_mode == 2)
    calls = []
    real = npu_flash_attention.npu_fusion_attention

    def recorded(*args, **kwargs):
        calls.append((kwargs.get("input_layout", args[4] if len(args) > 4 else None), kwargs.get("sparse_mode", 0)))
        return real(*args, **kwargs)

    monkeypatch.setattr(npu_flash_attention, "npu_fusion_attention", recorded)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    config._attn_implementation = "sdpa"
    cpu = transformers.LlamaForCausalLM(config)
    npu_config = copy.deepcopy(config)
    npu_config._attn_implementation = "flash_attention_2"
    npu = transformers.LlamaForCausalLM(npu_config)
    npu.load_state_dict(cpu.state_dict())
    npu = npu.npu()
    try:
        ids = torch.randint(0, 101, (3, 10))
        mask = torch.ones(3, 10, dtype=torch.long)
        mask[1, 6:] = 0  # right padding: rows of 10, 6 and 8 tokens
        mask[2, 8:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        expected = cpu(input_ids=ids, attention_mask=mask, labels=labels)
        actual = npu(input_ids=ids.npu(), attention_mask=mask.npu(), labels=labels.npu())
        assert ("TND", sparse_mode) in calls, calls
        kept = mask.bool()
        torch.testing.assert_close(actual.logits.cpu()[kept], expected.logits[kept], **TOL)
        torch.testing.assert_close(actual.loss.cpu(), expected.loss, **TOL)
        expected.loss.backward()
        actual.loss.backward()
        for (name, p), q in zip(cpu.named_parameters(), npu.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name, **TOL)
        calls.clear()
        prompt = ids[:1, :5]
        assert torch.equal(npu.generate(prompt.npu(), max_new_tokens=4, do_sample=False).cpu(),
                           cpu.generate(prompt, max_new_tokens=4, do_sample=False))
        assert ("BSND", sparse_mode) in calls, calls
    finally:
        npu_flash_attention.ATTN_MASK_NPU_CACHE.clear()  # later tests count live npu memory

def test_accelerate_picks_the_npu():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=False)
    assert accelerator.device.type == "npu"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(3, 4)
    accelerator.backward(model(x.to(accelerator.device)).square().sum())
    optimizer.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).square().sum().backward()
    ref_opt.step()
    for p, q in zip(reference.parameters(), model.parameters()):
        assert q.device.type == "npu"
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **TOL)


def test_fusion_attention_pse_gradient():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    pse = torch.randn(1, 2, 4, 4, requires_grad=True)
    pse_npu = pse.detach().npu().requires_grad_()
    out = torch_npu.npu_fusion_attention(q.npu(), k.npu(), v.npu(), 2, "BNSD", pse=pse_npu, scale=0.5)[0]
    expected = reference_attention(q, k, v, scale=0.5, pse=pse)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(pse_npu.grad.cpu(), pse.grad, **TOL)


def tiny_gpt2_and_data(transformers):
    """A 1-layer GPT-2 (no dropout) and 8 rows of 8 tokens as the Trainer's dataset."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    rows = torch.randint(0, 50, (8, 8))
    return model, [{"input_ids": r, "labels": r} for r in rows]


def test_hf_trainer_with_the_npu_fused_adamw_matches_the_cpu(tmp_path):
    """The Trainer's optim="adamw_torch_npu_fused" trains on the npu with
    NpuFusedAdamW, bit for bit like torch's fused AdamW on the cpu."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    model, data = tiny_gpt2_and_data(transformers)

    def train(optim, use_cpu):
        trained = copy.deepcopy(model)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / optim), max_steps=3, per_device_train_batch_size=4, optim=optim,
            learning_rate=1e-2, lr_scheduler_type="constant", use_cpu=use_cpu, report_to=[],
            save_strategy="no", logging_strategy="no", dataloader_pin_memory=False, disable_tqdm=True)
        trainer = transformers.Trainer(model=trained, args=args, train_dataset=data)
        trainer.train()
        return trainer

    on_npu = train("adamw_torch_npu_fused", use_cpu=False)
    assert isinstance(on_npu.optimizer.optimizer if hasattr(on_npu.optimizer, "optimizer") else on_npu.optimizer,
                      torch_npu.optim.NpuFusedAdamW)
    on_cpu = train("adamw_torch_fused", use_cpu=True)
    for (name, p), q in zip(on_npu.model.named_parameters(), on_cpu.model.parameters()):
        assert p.device.type == "npu", name
        assert torch.equal(p.detach().cpu(), q.detach()), name


def test_hf_trainer_with_bf16_trains_on_the_npu_under_autocast(tmp_path):
    """TrainingArguments(bf16=True): accelerate autocasts the npu to bfloat16; the
    loss follows the float32 run's."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model, data = tiny_gpt2_and_data(transformers)

    def train(bf16):
        trained = copy.deepcopy(model)
        seen = []
        trained.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(bf16)), max_steps=20, per_device_train_batch_size=4, bf16=bf16,
            learning_rate=1e-2, lr_scheduler_type="constant", report_to=[], save_strategy="no", logging_steps=1,
            dataloader_pin_memory=False, disable_tqdm=True)
        trainer = transformers.Trainer(model=trained, args=args, train_dataset=data)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        return trainer, losses, set(seen)

    mixed, mixed_losses, mixed_dtypes = train(True)
    full, full_losses, full_dtypes = train(False)
    assert next(mixed.model.parameters()).device.type == "npu"
    assert mixed_dtypes == {torch.bfloat16} and full_dtypes == {torch.float32}
    assert mixed_losses[-1] < 0.7 * mixed_losses[0]
    assert abs(mixed_losses[-1] - full_losses[-1]) < 0.1 * full_losses[0]
