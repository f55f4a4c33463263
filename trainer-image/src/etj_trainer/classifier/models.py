"""Models: any torchvision classification model by name, or a user model as ``module:callable``."""

from __future__ import annotations

import importlib

import torch
from torch import nn

from etj_trainer.classifier.model_specs import OLD_MODULES


def small_cnn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """A few-thousand-parameter CNN: enough for digits, cheap enough for 2-core CI."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, num_classes),
    )


def tiny_mlp(num_classes: int = 10, in_features: int = 3 * 8 * 8) -> nn.Module:
    """No BatchNorm, no dropout: its update depends only on the samples, which equivalence tests need."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 32), nn.Tanh(), nn.Linear(32, num_classes))


def build_model(spec: str, num_classes: int) -> nn.Module:
    if ":" in spec:
        module_name, attr = spec.split(":", 1)
        module_name = OLD_MODULES.get(module_name, module_name)
        factory = getattr(importlib.import_module(module_name), attr)
        model = factory(num_classes=num_classes)
    else:
        import torchvision

        model = torchvision.models.get_model(spec, weights=None, num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{spec} did not return a torch.nn.Module")
    return model


class _Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions with BatchNorm, identity or 1x1 projection shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet_tiny(num_classes: int = 10, in_channels: int = 3, width: int = 16) -> nn.Module:
    """A small ResNet with BatchNorm for 28-32 px images, sized for CPU (the Fashion-MNIST recipe bench).

    The stem keeps the full resolution; the residual blocks start at half of it (a block at full
    resolution would cost as much as the rest of the network together).
    """
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        _Block(width, 2 * width, 2),
        _Block(2 * width, 2 * width, 1),
        _Block(2 * width, 4 * width, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


def resnet_tiny_w8(num_classes: int = 10) -> nn.Module:
    """``resnet_tiny`` at width 8 (about a quarter of the compute): the CPU-sized recipe benchmark."""
    return resnet_tiny(num_classes, width=8)


def resnet_tiny_w16(num_classes: int = 10) -> nn.Module:
    return resnet_tiny(num_classes, width=16)
