# doctor-case: sampling each sequence of the batch in a Python loop (top-k filter and multinomial per row) every token
# loop: generation
# expect: launch_bound @ 26|25|24
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim, batch_size = 64, 32, 24

embed = nn.Embedding(vocab, dim).to(device)
rnn = nn.GRUCell(dim, dim).to(device)
head = nn.Linear(dim, vocab).to(device)
gen = torch.Generator(device=device).manual_seed(0)

tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
hidden = torch.zeros(batch_size, dim, device=device)
out = []
with torch.no_grad():
    for _ in range(10):
        hidden = rnn(embed(tokens), hidden)
        logits = head(hidden)
        next_tokens = torch.empty_like(tokens)
        for b in range(batch_size):
            top_vals, top_idx = logits[b].topk(8)
            next_tokens[b] = top_idx[torch.multinomial(top_vals.softmax(-1), 1, generator=gen)]
        tokens = next_tokens
        out.append(tokens)

print(torch.stack(out, dim=1).shape)
