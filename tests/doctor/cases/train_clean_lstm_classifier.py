# doctor-case: clean LSTM sequence classifier: padded batches copied once per step, gradient clipping, no host reads
# loop: training
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=400, dim=32, hidden=48, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, tokens):
        _, (h, _) = self.lstm(self.embed(tokens))
        return self.fc(h[-1])


model = LSTMClassifier().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
tokens = torch.randint(1, 400, (320, 20))
labels = torch.randint(0, 3, (320,))
for step in range(10):
    xb = tokens[step * 32:(step + 1) * 32].to(device)
    yb = labels[step * 32:(step + 1) * 32].to(device)
    loss = nn.functional.cross_entropy(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()

print("loss", loss.item())
