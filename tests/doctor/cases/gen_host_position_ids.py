# doctor-case: position ids built on the host with torch.arange and copied in for every generated token
# loop: generation
# expect: host_to_device_copy @ 29
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim, max_len = 200, 64, 32


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.ff = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, position_ids):
        h = self.tok(tokens) + self.pos(position_ids)
        return self.head(h + self.ff(h))


model = Decoder().to(device).eval()
tokens = torch.randint(3, vocab, (4, 5), device=device)
with torch.no_grad():
    for _ in range(12):
        position_ids = torch.arange(tokens.shape[1]).unsqueeze(0).to(device)
        logits = model(tokens, position_ids)
        next_tokens = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_tokens], dim=1)

print(tokens.shape)
