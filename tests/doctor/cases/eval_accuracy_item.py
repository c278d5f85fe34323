# doctor-case: evaluation loop (no optimizer) counts correct predictions with .sum().item() per batch
# loop: eval
# expect: hidden_sync @ 24
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
model.eval()
test_set = TensorDataset(torch.randn(512, 8, 8), torch.randint(0, 10, (512,)))
loader = DataLoader(test_set, batch_size=64, shuffle=False)

correct = 0
total = 0
with torch.no_grad():
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        outputs = model(images)
        _, predicted = torch.max(outputs, 1)
        total += labels.size(0)
        correct += (predicted == labels).sum().item()

print(f"accuracy: {100 * correct / total:.1f}%")
