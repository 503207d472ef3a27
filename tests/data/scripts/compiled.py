"""An 8-layer model under torch.compile: prints dynamo's counters (graphs, graph breaks, frames)
so that a run under perfdoctor can be compared with the bare run line by line.

The backend is "eager" (dynamo's graph capture without code generation: the graph count is
dynamo's decision, and no C compiler is needed); pass `inductor` as argv[1] to compile for real.
"""
import sys
import warnings

import torch
import torch.nn as nn
from torch._dynamo.utils import counters

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "eager"


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(32) for _ in range(8)], nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cmodel = torch.compile(model, backend=BACKEND)
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        for step in range(12):
            loss = nn.functional.mse_loss(cmodel(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 4 == 0:
                print(f"step {step} loss {loss.item():.6f}")
        convs = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
        copt = torch.optim.SGD(convs.parameters(), lr=1e-2)
        cconvs = torch.compile(convs, backend=BACKEND)
        for _ in range(3):
            closs = cconvs(torch.randn(2, 3, 12, 12).to(x.device)).square().mean()
            copt.zero_grad()
            closs.backward()
            copt.step()
        print(f"conv loss {closs.item():.6f}")
    print("warnings", sorted({str(w.message)[:60] for w in caught}))
    print("unique_graphs", counters["stats"]["unique_graphs"])
    print("graph_breaks", sum(counters["graph_break"].values()), sorted(k[:60] for k in counters["graph_break"])[:3])
    print("frames ok", counters["frames"]["ok"], "recompiles", counters["recompiles"] and dict(counters["recompiles"]))


if __name__ == "__main__":
    main()
