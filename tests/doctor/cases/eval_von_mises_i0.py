# doctor-case: scoring angles under a von Mises density normalised with the Bessel function i0: i0.out falls back on the chip
# loop: eval
# expect: cpu_fallback @ 15
import math
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
angles = torch.rand(400) * 2 * math.pi
concentration = torch.linspace(0.5, 4.0, 16, device=device)
log_likelihoods = []
with torch.no_grad():
    for i in range(0, 400, 40):
        theta = angles[i:i + 40].to(device).unsqueeze(1)
        normaliser = 2 * math.pi * torch.special.i0(concentration)
        density = torch.exp(concentration * torch.cos(theta)) / normaliser
        log_likelihoods.append(density.log().sum(0))
print(torch.stack(log_likelihoods).sum(0).argmax())
