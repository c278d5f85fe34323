# doctor-case: greedy token-by-token generation that checks `next_token.item() == eos_id` after every token
# loop: generation
# expect: hidden_sync @ 34
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
eos_id = 0
prompt = torch.tensor([[17, 42, 99, 7]], device=device)

generated = prompt
with torch.no_grad():
    logits, state = model(prompt)
    for _ in range(12):
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        generated = torch.cat([generated, next_token], dim=1)
        if next_token.item() == eos_id:
            break
        logits, state = model(next_token, state)

print(generated.tolist())
