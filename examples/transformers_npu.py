"""Tiny GPT-2 and Llama models from transformers configs (random weights, no
download) train and generate on the npu, through transformers' own NPU code
paths, and match the cpu.

Llama uses attn_implementation="flash_attention_2", which transformers sends to
torch_npu.npu_fusion_attention when it detects torch_npu. GPT-2 uses "sdpa"
(transformers' fp32 flash path looks for nn.Linear layers, which GPT-2's Conv1D
blocks are not).

    pip install -c constraints.txt transformers   # with torch==2.13.0 pinned
    python examples/transformers_npu.py
"""
import copy
import sys

import torch

import torch_npu

try:
    import transformers
except ImportError:
    sys.exit("this example needs transformers: pip install transformers (pin torch==2.13.0 in a constraint file)")


def build(name):
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel, config, "sdpa"
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    return transformers.LlamaForCausalLM, config, "flash_attention_2"


def train(model, batches, device, steps=3):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in batches[:steps]:
        optimizer.zero_grad()
        loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    batches = [torch.randint(0, 128, (4, 16)) for _ in range(3)]
    for name in ("gpt2", "llama"):
        cls, config, attention = build(name)
        cpu = cls(config)
        npu_config = copy.deepcopy(config)
        npu_config._attn_implementation = attention
        npu = cls(npu_config)
        npu.load_state_dict(cpu.state_dict())
        npu.to("npu")
        cpu_losses, npu_losses = train(cpu, batches, "cpu"), train(npu, batches, "npu")
        prompt = batches[0][:1, :5]
        cpu_text = cpu.generate(prompt, max_new_tokens=8, do_sample=False)
        npu_text = npu.generate(prompt.npu(), max_new_tokens=8, do_sample=False).cpu()
        drift = max((p.detach() - q.detach().cpu()).abs().max().item()
                    for p, q in zip(cpu.parameters(), npu.parameters()))
        print(f"{name} ({attention} on the npu): losses cpu {[round(v, 5) for v in cpu_losses]}, "
              f"npu {[round(v, 5) for v in npu_losses]}; largest parameter difference after 3 steps {drift:.1e}; "
              f"greedy generation equal: {torch.equal(cpu_text, npu_text)}")
        assert drift < 1e-5 and torch.equal(cpu_text, npu_text)
    print(torch_npu.NPUFallbackMode.get_fallback_stats())


if __name__ == "__main__":
    main()
