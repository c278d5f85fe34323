# doctor-case: an MLP captured once as an NPUGraph and replayed on new inputs copied into its static buffer
# loop: eval
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "npu"
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to(device).eval()
static_x = torch.zeros(16, 64, device=device)
graph = torch.npu.NPUGraph()
with torch.no_grad(), torch.npu.graph(graph):
    static_y = model(static_x)
batches = torch.randn(20, 16, 64).to(device)
results = torch.empty(20, 16, 10, device=device)
for i in range(20):
    static_x.copy_(batches[i])
    graph.replay()
    results[i].copy_(static_y)
print(results.argmax(-1).float().mean().item())
