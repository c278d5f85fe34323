# doctor-case: greedy generation with Hugging Face transformers' generate(), once per prompt: its decoding loop checks on the host after every token whether all sequences finished (inside transformers), reported at the line that called it
# loop: generation
# expect: hidden_sync @ 15
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2)
model = GPT2LMHeadModel(config).to(device).eval()
prompts = torch.randint(1, 256, (6, 8))
outputs = []
for prompt in prompts:
    generated = model.generate(prompt[None].to(device), max_new_tokens=12, do_sample=False)
    outputs.append(generated[0, 8:])
print(torch.stack(outputs).shape)
