# doctor-case: clean GAN training: two optimizers, device-side latent noise, losses read every 5 steps
# loop: training
# expect: clean
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
latent = 16

G = nn.Sequential(nn.Linear(latent, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
D = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to(device)
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
real_data = (torch.randn(640, 2) * 0.5 + torch.tensor([2.0, -1.0])).pin_memory()
ones = torch.ones(64, 1, device=device)
zeros = torch.zeros(64, 1, device=device)

for step in range(10):
    real = real_data[step * 64:(step + 1) * 64].to(device, non_blocking=True)
    z = torch.randn(64, latent, device=device)
    fake = G(z)
    d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = bce(D(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    if step % 5 == 4:
        print(f"step {step}: d {d_loss.item():.3f} g {g_loss.item():.3f}")
