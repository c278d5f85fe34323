# doctor-case: clean compiled inference: inference_mode, each input copied once, results gathered at the end
# loop: compile
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 8)).to(device).eval()
fast = torch.compile(model)
requests = torch.randn(10, 16, 32).pin_memory()
outputs = torch.empty(10, 16, dtype=torch.long, device=device)
with torch.inference_mode():
    for i in range(len(requests)):
        x = requests[i].to(device, non_blocking=True)
        outputs[i] = fast(x).argmax(dim=-1)

print(outputs.cpu().tolist()[0])
