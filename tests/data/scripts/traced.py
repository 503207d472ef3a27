"""A model traced and exported before it trains: torch.jit.trace (as TensorBoard's
`SummaryWriter.add_graph(net, x)` does: it runs the forward twice and compares the graphs), torch.fx's
symbolic tracing, torch.export, then a few training steps. Each prints what it captured, so that a
run under perfdoctor can be compared with the bare run line by line: perfdoctor's probes must do
nothing observable while torch traces or exports. (A saved TorchScript module is not compared: its
debug tables hold the Python stack of the trace, runpy's and perfdoctor's frames included.)
"""
import warnings

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = x.view(-1, self.num_flat_features(x))  # the 60-minute blitz's idiom: ints read while tracing
        return self.fc(x)

    def num_flat_features(self, x):
        n = 1
        for s in x.size()[1:]:
            n *= s
        return n


class Flat(nn.Module):
    """A forward torch.fx can trace symbolically (no iteration over a size)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


def main():
    torch.manual_seed(0)
    net, flat = Net(), Flat()
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(net, x)  # check_trace: the forward runs twice, the graphs must agree
        print(traced.code)
        net.eval()
        traced_eval = torch.jit.trace(net, x)  # add_graph traces an eval-mode model with grad on
        net.train()
        print(traced_eval.graph.findNode("aten::view") is not None)
        gm = torch.fx.symbolic_trace(flat)
        print(gm.code)
        ep = torch.export.export(flat, (x,))
        print(ep.graph_module.code)
    print("warnings", sorted({f"{w.category.__name__}: {str(w.message)[:60]}" for w in caught}))
    opt = torch.optim.SGD(list(net.parameters()) + list(flat.parameters()), lr=0.1)
    for step in range(8):
        loss = net(x).sum() + flat(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, f"{loss.item():.5f}")


if __name__ == "__main__":
    main()
