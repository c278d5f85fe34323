# doctor-case: clean greedy generation: fixed number of new tokens, no per-token host reads, .tolist() once at the end
# loop: generation
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, dim = 256, 64


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, state=None):
        out, state = self.rnn(self.embed(tokens), state)
        return self.head(out), state


model = TinyDecoder().to(device).eval()
prompt = torch.tensor([[17, 42, 99, 7], [3, 5, 8, 13]], device=device)
new_tokens = []
with torch.no_grad():
    logits, state = model(prompt)
    for _ in range(12):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        new_tokens.append(next_token)
        logits, state = model(next_token, state)

print(torch.cat([prompt] + new_tokens, dim=1).tolist())
