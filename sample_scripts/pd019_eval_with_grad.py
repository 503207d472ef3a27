"""PD019: validation forward passes that record autograd.

After every step the loop checks a validation batch with the model in eval mode, but without
`torch.no_grad()`: autograd records the forward anyway and keeps every activation it would need
for a backward that never comes, until the output is dropped.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 60


def evaluate(model, x, y):
    model.eval()
    out = model(x)  # expect: PD019
    loss = F.cross_entropy(out, y)
    model.train()
    return loss


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    inputs = torch.randn(4096, 256, device=device)
    targets = torch.randint(0, 10, (4096,), device=device)
    val_x = torch.randn(512, 256, device=device)
    val_y = torch.randint(0, 10, (512,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (128,), device=device)
        loss = F.cross_entropy(model(inputs[idx]), targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        val_loss = evaluate(model, val_x, val_y)
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} val {val_loss.item():.4f}")


if __name__ == "__main__":
    main()
