"""Tensors made on the host inside the step and moved to the device: in a helper of another file,
in the model's forward, and a noise tensor moved with type_as."""
import os

import torch
import torch.nn.functional as F
from models import Attn
from utils import make_batch, random_labels

STEPS = int(os.environ.get("STEPS", "40"))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Attn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        imgs = make_batch(8).to(device)
        y = random_labels(8, 10).to(device)
        noise = torch.randn(imgs.shape).type_as(imgs)  # host noise, moved to the batch's device
        x = (imgs + 0.1 * noise).flatten(2).transpose(1, 2)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
