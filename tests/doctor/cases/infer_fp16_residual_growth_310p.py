# doctor-case: a float16 residual MLP whose activations outgrow float16's range: a 310P saturates them to 65504, silently
# loop: eval
# target: ascend310p3
# expect: float16_overflow @ 18
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
blocks = nn.ModuleList(nn.Linear(64, 64) for _ in range(4)).to(device).half().eval()
for block in blocks:
    nn.init.normal_(block.weight, std=0.6)
inputs = torch.randn(64, 64).half()
with torch.no_grad():
    for i in range(0, 64, 8):
        h = inputs[i:i + 8].to(device) * 30
        for block in blocks:
            h = h + block(h) * 8
        print(h.float().abs().max().item())
