"""A PyTorch model in a file, NNLO style: train it with

    mpiexec -n 2 distnn train --model examples/mnist_torch.py --num_epochs 3

distnn imports this file and calls get_model() (NNLO's name; build_model() is looked for
first), wraps the returned torch.nn.Module in distnn.torch.TorchModel, and trains it with
the same options, training rules, checkpoints and evaluation as a zoo model.
"""
import torch
from torch import nn


class MNistNet(nn.Module):
    """Two 3x3 convolutions with batch normalization and max pooling, then two dense
    layers (28x28 inputs)."""

    def __init__(self, channels: int = 1, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def get_model(**args):
    """NNLO's entry point; keyword arguments are NNLO's model options (unused here)."""
    return MNistNet()


def get_name():
    return "mnist_torch"
