# doctor-case: inference without torch.no_grad(): outputs.append(model(x)) keeps every batch's autograd graph
# loop: eval
# expect: memory_growth @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)).to(device)
model.eval()
data = torch.randn(640, 64)

outputs = []
for start in range(0, 640, 64):
    x = data[start:start + 64].to(device)
    outputs.append(model(x))

preds = torch.cat(outputs).argmax(dim=1)
print("predictions", preds.shape)
