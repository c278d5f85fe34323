# doctor-case: language-model head tied to the embedding, transposed with .t().contiguous() on each forward in eval
# loop: eval
# expect: strided_copy @ 19
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class TinyLM(nn.Module):
    def __init__(self, vocab=2048, dim=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(dim, dim), nn.GELU())

    def forward(self, tokens):
        h = self.mix(self.embed(tokens))
        return h @ self.embed.weight.t().contiguous()


model = TinyLM().to(device).eval()
val_tokens = torch.randint(0, 2048, (10, 8, 17))
nll = torch.zeros((), device=device)
with torch.no_grad():
    for chunk in val_tokens:
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1])
        nll += nn.functional.cross_entropy(logits.reshape(-1, 2048), chunk[:, 1:].reshape(-1))

print("val loss", (nll / len(val_tokens)).item())
