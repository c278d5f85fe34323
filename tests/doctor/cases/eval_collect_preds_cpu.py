# doctor-case: inference loop moves each batch's probabilities to the host with .cpu() to concatenate later
# loop: eval
# expect: hidden_sync @ 31
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TextCNN(nn.Module):
    def __init__(self, vocab=500, dim=32, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, 64, kernel_size=3, padding=1)
        self.fc = nn.Linear(64, classes)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        h = torch.relu(self.conv(h)).amax(dim=2)
        return self.fc(h)


model = TextCNN().to(device).eval()
corpus = torch.randint(0, 500, (320, 24))
all_probs = []
with torch.inference_mode():
    for start in range(0, len(corpus), 40):
        batch = corpus[start:start + 40].to(device)
        probs = model(batch).softmax(dim=-1)
        all_probs.append(probs.cpu())

probs = torch.cat(all_probs)
print("predicted class counts", torch.bincount(probs.argmax(1), minlength=4).tolist())
