# doctor-case: a spectrogram model taking magnitudes with torch.hypot of real and imaginary parts: hypot.out falls back on the chip
# loop: training
# expect: cpu_fallback @ 17
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
proj = nn.Linear(64, 2 * 64).to(device)
head = nn.Linear(64, 4).to(device)
optimizer = torch.optim.SGD([*proj.parameters(), *head.parameters()], lr=1e-2)
frames = torch.randn(256, 64)
labels = torch.randint(0, 4, (256,))
for step in range(12):
    x, y = frames[step * 16:(step + 1) * 16].to(device), labels[step * 16:(step + 1) * 16].to(device)
    real, imag = proj(x).chunk(2, dim=1)
    magnitude = torch.hypot(real, imag)
    loss = nn.functional.cross_entropy(head(magnitude), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
