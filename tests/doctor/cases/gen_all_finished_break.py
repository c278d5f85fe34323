# doctor-case: batched sampling that stops when `finished.all()` is true, checked after every token
# loop: generation
# expect: hidden_sync @ 29
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
    for _ in range(12):
        h, c = cell(embed(tokens[:, -1]), (h, c))
        probs = F.softmax(head(h) / 0.9, dim=-1)
        next_tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        next_tok = torch.where(finished, torch.full_like(next_tok, pad_id), next_tok)
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
        finished |= next_tok == eos_id
        if finished.all():
            break

print(tokens.shape)
