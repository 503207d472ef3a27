"""PD007 fixed: the forward pass and the loss run under `torch.autocast` in bfloat16.

Weights, gradients and the optimizer stay fp32; autocast runs matmuls in bf16 and keeps
precision-sensitive ops (softmax, norms, the loss) in fp32. bf16 needs no GradScaler.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 100


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class MLPClassifier(nn.Module):
    def __init__(self, dim: int = 512, depth: int = 2, classes: int = 10):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = MLPClassifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(8192, 512, device=device)
    targets = torch.randint(0, 10, (8192,), device=device)

    for step in range(STEPS):
        idx = torch.randint(0, len(inputs), (256,), device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = model(inputs[idx])
            loss = F.cross_entropy(logits, targets[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
