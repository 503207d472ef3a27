"""A script that installs its own signal handlers and writes its own files: a checkpoint on
SIGUSR1 (sent to itself mid-training, as a cluster scheduler would), a log file, and a final
state_dict. Prints the handlers it finds installed, so that a run under perfdoctor can be compared
with the bare run. Writes into argv[1] (default: the current directory).
"""
import os
import signal
import sys

import torch
import torch.nn as nn

OUT = sys.argv[1] if len(sys.argv) > 1 else "."


def name(h) -> str:
    return getattr(h, "__name__", str(h))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    saved = []

    def on_usr1(signum, frame):
        path = os.path.join(OUT, f"checkpoint_{len(saved)}.pt")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
        saved.append(path)
        print(f"signal {signum}: checkpoint {os.path.basename(path)}")

    signal.signal(signal.SIGUSR1, on_usr1)
    print("handlers", name(signal.getsignal(signal.SIGINT)), name(signal.getsignal(signal.SIGTERM)),
          name(signal.getsignal(signal.SIGUSR1)))
    g = torch.Generator().manual_seed(1)
    with open(os.path.join(OUT, "train.log"), "w") as log:
        for step in range(20):
            x = torch.randn(32, 8, generator=g)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.write(f"{step} {loss.item():.6f}\n")
            if step in (4, 12):
                os.kill(os.getpid(), signal.SIGUSR1)
    torch.save(model.state_dict(), os.path.join(OUT, "final.pt"))
    print("checkpoints", len(saved), "final loss", f"{loss.item():.6f}")
    print("handlers at the end", name(signal.getsignal(signal.SIGINT)), name(signal.getsignal(signal.SIGUSR1)))


if __name__ == "__main__":
    main()
