# doctor-case: a topic model drawing document mixtures from a Dirichlet: _sample_dirichlet has no chip kernel
# loop: training
# expect: cpu_fallback @ 19
# expect: hidden_sync @ 19
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, topics = 200, 10
topic_words = nn.Parameter(torch.randn(topics, vocab, device=device) * 0.01)
encoder = nn.Linear(vocab, topics).to(device)
optimizer = torch.optim.Adam([topic_words, *encoder.parameters()], lr=1e-2)
docs = torch.randint(0, 5, (128, vocab)).float()

for step in range(10):
    bow = docs[step * 8:(step + 1) * 8].to(device)
    alpha = nn.functional.softplus(encoder(bow)) + 0.1
    theta = torch.distributions.Dirichlet(alpha).rsample()
    recon = theta @ topic_words.softmax(1)
    loss = -(bow * recon.clamp_min(1e-9).log()).sum(1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
