# doctor-case: a speech model trained with CTC, the lengths given as tensors: _ctc_loss.Tensor and its backward fall back on the chip
# loop: training
# expect: cpu_fallback @ 20
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
encoder = nn.GRU(20, 32, batch_first=False).to(device)
classifier = nn.Linear(32, 12).to(device)
optimizer = torch.optim.Adam([*encoder.parameters(), *classifier.parameters()], lr=1e-3)
for step in range(8):
    feats = torch.randn(30, 4, 20, device=device)
    targets = torch.randint(1, 12, (4, 6), device=device)
    input_lengths = torch.full((4,), 30, dtype=torch.long, device=device)
    target_lengths = torch.full((4,), 6, dtype=torch.long, device=device)
    hidden, _ = encoder(feats)
    log_probs = classifier(hidden).log_softmax(2)
    loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
