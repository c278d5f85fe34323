"""Train a small CNN on scikit-learn's 8x8 handwritten digits.

Two convolutions and a linear layer classify the 1,797 images of
sklearn.datasets.load_digits (bundled with scikit-learn, nothing to download).
The whole dataset is moved to the device once as float32 and split into train
and test sets there with a seeded permutation; mini-batches are slices of it.
It prints the loss per epoch and the test accuracy at the end.

    python examples/cnn_digits.py                 # cuda if available, else cpu
    python examples/cnn_digits.py --device npu    # the emulated npu (torch_npu)
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from sklearn.datasets import load_digits
except ImportError:
    raise SystemExit("cnn_digits needs scikit-learn: pip install scikit-learn")


class DigitsCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)   # 8x8 -> 8x8
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)  # 4x4 -> 4x4
        self.fc = nn.Linear(32 * 2 * 2, classes)

    def forward(self, x):  # (batch, 1, 8, 8) -> (batch, classes) logits
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda, cpu, npu, ... (default: cuda if available)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1).div_(16.0).to(device)
    labels = torch.tensor(digits.target, dtype=torch.long).to(device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    order = torch.randperm(len(labels), device=device, generator=gen)
    n_test = len(labels) // 5
    test, train = order[:n_test], order[n_test:]

    model = DigitsCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    losses = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        shuffled = train[torch.randperm(len(train), device=device, generator=gen)]
        total = torch.zeros((), device=device)
        for i in range(0, len(shuffled), args.batch):
            idx = shuffled[i:i + args.batch]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(idx)
        losses.append((total / len(train)).item())  # once per epoch
        print(f"epoch {epoch:3d}  loss {losses[-1]:.4f}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(images[test]).argmax(dim=1) == labels[test]).float().mean().item()
    print(f"test accuracy {accuracy:.1%} on {n_test} images")
    return {"losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    main()
