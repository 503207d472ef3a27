"""A stand-in for pytorch/examples time_sequence_prediction: one LBFGS step whose closure is
evaluated up to 20 times, each over a long LSTMCell sequence, so that a single optimizer step
holds hundreds of thousands of operator calls. Then a prediction loop without gradients.

argv[1]: the sequence length (default 150); argv[2]: where to save the predictions (optional).
"""
import sys

import torch
import torch.nn as nn

T = int(sys.argv[1]) if len(sys.argv) > 1 else 150


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, x, future=0):
        outputs = []
        h_t = torch.zeros(x.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(x.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(x.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(x.size(0), 51, dtype=torch.double)
        for input_t in x.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs += [self.linear(h_t2)]
        for _ in range(future):
            h_t, c_t = self.lstm1(outputs[-1], (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs += [self.linear(h_t2)]
        return torch.cat(outputs, dim=1)


def main():
    torch.manual_seed(0)
    x = torch.linspace(0, 20, T + 1, dtype=torch.double)
    data = torch.sin(x + torch.rand(16, 1, dtype=torch.double) * 6.0)
    inp, target = data[:, :-1].unsqueeze(-1).squeeze(-1), data[:, 1:]
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    evals = 0

    def closure():
        nonlocal evals
        evals += 1
        optimizer.zero_grad()
        loss = criterion(seq(inp), target)
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        pred = seq(inp[:2], future=T // 2)
        loss = criterion(pred[:, :-T // 2], target[:2])
    print(f"closure evaluations {evals} test loss {loss.item():.8f}")
    if len(sys.argv) > 2:
        torch.save(pred, sys.argv[2])


if __name__ == "__main__":
    main()
