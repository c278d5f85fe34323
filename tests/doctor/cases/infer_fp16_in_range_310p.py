# doctor-case: float16 inference on a 310P whose activations stay well inside float16's range: nothing saturates
# loop: eval
# target: ascend310p3
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8)).to(device).half().eval()
inputs = torch.randn(160, 32).half()
predictions = []
with torch.no_grad():
    for i in range(0, 160, 16):
        x = inputs[i:i + 16].to(device)
        predictions.append(model(x).softmax(-1))
print(torch.cat(predictions).float().argmax(1).bincount())
