"""A VGG-style net built from a config: each convolution appended to a list, its BatchNorm added
with `+=`, the list wrapped in nn.Sequential(*layers). The eight convolutions keep their bias
(the default), which the BatchNorm after each cancels."""
import torch.nn as nn

VGG11 = [8, "M", 16, "M", 16, 16, "M", 32, 32, "M", 32, 32]


def make_layers(cfg):
    layers = []
    c = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers.append(nn.Conv2d(c, v, kernel_size=3, padding=1))  # the conv of all eight
        layers += [nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
        c = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = make_layers(VGG11)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))
