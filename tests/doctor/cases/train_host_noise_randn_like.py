# doctor-case: denoising autoencoder draws its noise on the host every step: torch.randn_like(x_cpu).to(device)
# loop: training
# expect: host_to_device_copy @ 19
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

encoder = nn.Sequential(nn.Linear(64, 16), nn.ReLU())
decoder = nn.Sequential(nn.Linear(16, 64))
model = nn.Sequential(encoder, decoder).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

data = torch.randn(1024, 64).pin_memory()
for step in range(12):
    x_cpu = data[step * 64:(step + 1) * 64]
    x = x_cpu.to(device, non_blocking=True)
    noise = torch.randn_like(x_cpu).to(device)
    recon = model(x + 0.1 * noise)
    loss = nn.functional.mse_loss(recon, x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("final loss", loss.item())
