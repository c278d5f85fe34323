# doctor-case: a 0-dim npu tensor used as an index: itos[next_id] into a Python list, every token
# loop: generation
# expect: hidden_sync @ 22
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

itos = [chr(ord("a") + i) for i in range(26)] + [" ", "."]
stoi = {ch: i for i, ch in enumerate(itos)}
vocab = len(itos)

bigram = nn.Embedding(vocab, vocab).to(device)
gen = torch.Generator(device=device).manual_seed(0)
current = torch.tensor(stoi["t"], device=device)
text = ["t"]
with torch.no_grad():
    for _ in range(12):
        probs = torch.softmax(bigram(current), dim=-1)
        current = torch.multinomial(probs, 1, generator=gen)[0]
        text.append(itos[current])

print("".join(text))
