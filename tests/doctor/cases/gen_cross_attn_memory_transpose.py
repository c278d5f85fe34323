# doctor-case: decoder recomputes memory.transpose(1, 2).contiguous() of the unchanged encoder output for every token
# loop: generation
# expect: strided_copy @ 23
import math

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim = 100, 64


class CrossAttnDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.q = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, token, memory):                  # memory: (batch, src_len, dim)
        q = self.q(self.embed(token))                  # (batch, 1, dim)
        keys_t = memory.transpose(1, 2).contiguous()
        attn = torch.softmax(q @ keys_t / math.sqrt(dim), dim=-1)
        return self.head(attn @ memory)


encoder = nn.Sequential(nn.Linear(32, dim), nn.Tanh()).to(device).eval()
decoder = CrossAttnDecoder().to(device).eval()
source = torch.randn(8, 256, 32, device=device)
with torch.no_grad():
    memory = encoder(source)
    token = torch.ones(8, 1, dtype=torch.long, device=device)
    outputs = []
    for _ in range(12):
        token = decoder(token, memory)[:, -1:].argmax(dim=-1)
        outputs.append(token)

print(torch.cat(outputs, dim=1).shape)
