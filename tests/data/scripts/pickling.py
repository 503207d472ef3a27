"""Saves and copies the user's objects mid-training, the way real scripts do: `torch.save(model)`
(pickles the whole module, as pytorch/examples word_language_model does), `copy.deepcopy(model)`
(EMA / best-model copies), `pickle.dumps` of the dataset, the DataLoader and the optimizer.

Writes its artifacts into the folder given as argv[1] (default: the current directory).
"""
import copy
import io
import os
import pickle
import pickletools
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

OUT = sys.argv[1] if len(sys.argv) > 1 else "."


class Pairs(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.rnn = nn.LSTM(32, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        h = self.body(x)
        h, _ = self.rnn(h.unsqueeze(1))
        return self.head(h[:, -1])


def conv_net() -> nn.Sequential:
    layers: list = []
    c = 3
    for v in (8, 8, 16):
        layers.append(nn.Conv2d(c, v, 3, padding=1))
        layers.append(nn.BatchNorm2d(v))
        layers += [nn.ReLU()]
        c = v
    return nn.Sequential(*layers).to(memory_format=torch.channels_last)


def modules_pickled(b: bytes) -> list[str]:
    """The modules whose classes or functions a pickle refers to (tensor pickles hold addresses, so
    their bytes differ from run to run; what they refer to does not)."""
    mods, strings = set(), []
    for op, arg, _ in pickletools.genops(b):
        if op.name == "GLOBAL":
            mods.add(arg.split(" ")[0])
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            mods.add(strings[-2])
        elif isinstance(arg, str):
            strings.append(arg)
    return sorted(mods)


def same_tensors(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def main():
    torch.manual_seed(0)
    data = Pairs(8 * 24)
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 6 == 5:
            buf = io.BytesIO()
            torch.save(model, buf)  # the whole module, pickled
            buf.seek(0)
            back = torch.load(buf, weights_only=False)
            clone = copy.deepcopy(model)
            print(f"step {step} loss {loss.item():.6f} torch.save-load-equal "
                  f"{same_tensors(back.state_dict().values(), model.state_dict().values())} deepcopy-equal "
                  f"{same_tensors(clone.state_dict().values(), model.state_dict().values())}")
            print("  model refers to", modules_pickled(pickle.dumps(model)))
            print("  loader refers to", modules_pickled(pickle.dumps(loader)), "dataset round-trip",
                  same_tensors([pickle.loads(pickle.dumps(data)).x], [data.x]))
            print("  optimizer refers to", modules_pickled(pickle.dumps(opt)), "deepcopy",
                  type(copy.deepcopy(opt)).__name__)
            print("  model attributes", sorted(vars(model)), "hooks", len(model._forward_hooks),
                  len(model._forward_pre_hooks), len(clone._forward_hooks))
            print("  loader attributes", sorted(vars(loader)))
    convs = conv_net()  # layers appended to a list, then nn.Sequential(*layers), in channels_last
    copt = torch.optim.SGD(convs.parameters(), lr=1e-2)
    for _ in range(3):
        closs = convs(torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)).square().mean()
        copt.zero_grad()
        closs.backward()
        copt.step()
    cclone = copy.deepcopy(convs)
    print("conv net refers to", modules_pickled(pickle.dumps(convs)), "deepcopy-equal",
          same_tensors(cclone.state_dict().values(), convs.state_dict().values()), f"{closs.item():.6f}")
    torch.save(model, os.path.join(OUT, "model_full.pt"))
    torch.save(model.state_dict(), os.path.join(OUT, "model_state.pt"))
    # (pickled tensors hold storage addresses: a pickle file of the dataset differs from run to run
    # even bare, so the loader and dataset are checked above by what their pickles refer to)
    print("done", f"{loss.item():.6f}")


if __name__ == "__main__":
    main()
