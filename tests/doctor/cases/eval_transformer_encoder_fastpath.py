# doctor-case: a TransformerEncoder evaluated under no_grad takes PyTorch's fast path, _transformer_encoder_layer_fwd, which the chip runs on the CPU
# loop: eval
# expect: cpu_fallback @ 16
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(device).eval()
sentences = torch.randn(96, 12, 64)
pooled = []
with torch.no_grad():
    for i in range(0, 96, 8):
        x = sentences[i:i + 8].to(device)
        h = encoder(x)
        pooled.append(h.mean(1))
print(torch.cat(pooled).shape)
