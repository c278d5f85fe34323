# doctor-case: clean inference: per-batch predictions kept on the device, concatenated and moved to the host once
# loop: eval
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Embedding(300, 32), nn.Flatten(), nn.Linear(32 * 12, 3)).to(device).eval()
tokens = torch.randint(0, 300, (400, 12))
preds = []
with torch.no_grad():
    for batch in tokens.split(40):
        preds.append(model(batch.to(device)).argmax(dim=-1))
preds = torch.cat(preds).cpu()
print("class counts", torch.bincount(preds, minlength=3).tolist())
