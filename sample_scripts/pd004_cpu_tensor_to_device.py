"""PD004: a tensor made on the CPU every step, then copied to the device.

`torch.randn(x.shape)` fills the noise on the CPU and `.to(device)` copies it over PCIe and
synchronises with the host, every step. Creating it on the device costs one kernel.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 120
NOISE_STD = 0.1


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 256)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # A denoising autoencoder on a synthetic dataset that lives on the device.
    data = torch.randn(8192, 256, device=device)

    for step in range(STEPS):
        x = data[torch.randint(0, len(data), (128,), device=device)]
        noise = torch.randn(x.shape).to(device)  # expect: PD004
        loss = F.mse_loss(model(x + NOISE_STD * noise), x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
