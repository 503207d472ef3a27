"""PD034: a language model's output layer over a vocabulary of 5003 tokens, trained in bf16 autocast
on a CUDA-targeting script: 5003 is not a multiple of 8, so tensor cores run the biggest matmul of
the step slower.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 5003
STEPS = 200


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)  # expect: PD034

    def forward(self, idx):
        h = self.embed(idx)
        return self.head(h + self.mlp(h))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyLM(VOCAB).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator(device=device).manual_seed(0)
    for step in range(STEPS):
        idx = torch.randint(0, VOCAB, (8, 32), device=device, generator=g)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), idx[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
