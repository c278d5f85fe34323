# doctor-case: a Kalman filter over a sensor stream on the npu: the innovation covariance is inverted with torch.linalg.inv, which falls back on the chip at every update
# loop: pipeline
# expect: cpu_fallback @ 18
import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
F_ = torch.eye(4, device=device) + 0.1 * torch.diag(torch.ones(2, device=device), 2)
H = torch.eye(2, 4, device=device)
Q, R = 0.01 * torch.eye(4, device=device), 0.1 * torch.eye(2, device=device)
state, P = torch.zeros(4, device=device), torch.eye(4, device=device)
readings = torch.randn(40, 2)
estimates = []
for t in range(40):
    z = readings[t].to(device)
    state, P = F_ @ state, F_ @ P @ F_.T + Q
    S = H @ P @ H.T + R
    K = P @ H.T @ torch.linalg.inv(S)
    state = state + K @ (z - H @ state)
    P = (torch.eye(4, device=device) - K @ H) @ P
    estimates.append(state)
print(torch.stack(estimates)[-1])
