"""Two conv nets under autocast, neither in channels_last: a library's ResNet (built by its
builder, no nn.Conv2d in this project's files for it) and a VGG built in models.py from appended
layers. perfdoctor must find both from the modules the run called."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))
import tinyvision  # noqa: E402
from models import VGG  # noqa: E402

STEPS = int(os.environ.get("STEPS", "12"))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resnet = tinyvision.tiny_resnet().to(device)
    vgg = VGG().to(device)
    params = list(resnet.parameters()) + list(vgg.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    for step in range(STEPS):
        x = torch.randn(8, 3, 16, 16, device=device)
        y = torch.randint(0, 10, (8,), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(resnet(x), y) + F.cross_entropy(vgg(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
