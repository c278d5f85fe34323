# doctor-case: generated ids collected in a Python list with int(next_id) after every token; the model's TransformerEncoderLayer under no_grad takes PyTorch's fast path, which the chip runs on the CPU
# loop: generation
# expect: hidden_sync @ 34
# expect: cpu_fallback @ 24
import torch
import torch.nn as nn

torch.manual_seed(1)
device = "cuda" if torch.cuda.is_available() else "cpu"


class CharModel(nn.Module):
    def __init__(self, vocab=96, dim=64, context=16):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, 128, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        idx = idx[:, -self.context:]
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.block(self.tok(idx) + self.pos(pos)))


model = CharModel().to(device).eval()
context = torch.tensor([[5, 12, 33]], device=device)
out_ids = []
with torch.no_grad():
    for _ in range(12):
        logits = model(context)[:, -1, :]
        next_id = logits.argmax(dim=-1)
        out_ids.append(int(next_id))
        context = torch.cat([context, next_id[:, None]], dim=1)

print(out_ids)
