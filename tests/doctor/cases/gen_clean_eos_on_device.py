# doctor-case: clean batched sampling: end-of-sequence tracked on the device (torch.where), checked every 8 tokens
# loop: generation
# expect: clean
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim, batch = 128, 48, 6
eos_id, pad_id = 1, 0

embed = nn.Embedding(vocab, dim).to(device)
cell = nn.LSTMCell(dim, dim).to(device)
head = nn.Linear(dim, vocab).to(device)

gen = torch.Generator(device=device).manual_seed(0)
tokens = torch.full((batch, 1), 2, dtype=torch.long, device=device)
finished = torch.zeros(batch, dtype=torch.bool, device=device)
h = c = torch.zeros(batch, dim, device=device)
with torch.no_grad():
    for i in range(16):
        h, c = cell(embed(tokens[:, -1]), (h, c))
        probs = F.softmax(head(h), dim=-1)
        next_tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        next_tok = torch.where(finished, torch.full_like(next_tok, pad_id), next_tok)
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
        finished |= next_tok == eos_id
        if (i + 1) % 8 == 0 and finished.all():
            break

print(tokens.shape)
