# doctor-case: training loop prints the loss tensor itself every step (debug print left in)
# loop: training
# expect: hidden_sync @ 33
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, n_in=20, n_hidden=48, n_classes=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, n_hidden), nn.GELU(), nn.Linear(n_hidden, n_classes))

    def forward(self, x):
        return self.body(x)


def main():
    torch.manual_seed(1)
    device = torch.device("cuda")
    model = Classifier().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.randn(256, 20)
    labels = torch.randint(0, 5, (256,))
    for step in range(10):
        start = (step * 32) % 256
        x = data[start:start + 32].to(device)
        y = labels[start:start + 32].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step", step, "loss", loss)


if __name__ == "__main__":
    main()
