# doctor-case: clean DataLoader training: pin_memory batches, running loss kept on the device, read once per epoch
# loop: training
# expect: clean
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

dataset = TensorDataset(torch.randn(192, 3, 8, 8), torch.randint(0, 5, (192,)))
loader = DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=True,
                    generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 5)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.CrossEntropyLoss()

for epoch in range(2):
    running = torch.zeros((), device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    print(f"epoch {epoch}: loss {(running / len(loader)).item():.4f}")
