# doctor-case: generation through a model compiled with dynamic=False: the sequence grows by a token each step, so every step recompiles
# loop: compile
# expect: compile @ 19|32
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim = 128, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = torch.cumsum(torch.tanh(self.mix(h)), dim=1)      # each position sees the ones before it
        return self.head(h)


model = TinyLM().to(device).eval()
# "static shapes are fastest", as a tuning guide says: but the input grows with every token
fast = torch.compile(model,
                     dynamic=False)
tokens = torch.tensor([[1, 2, 3]], device=device)
with torch.no_grad():
    for _ in range(6):
        logits = fast(tokens)
        next_token = logits[:, -1:].argmax(dim=-1)
        tokens = torch.cat([tokens, next_token], dim=1)

print(tokens.tolist())
