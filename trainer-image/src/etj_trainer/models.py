"""Models: any torchvision classification model by name, or a user model as ``module:callable``."""

from __future__ import annotations

import importlib

from torch import nn


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
        factory = getattr(importlib.import_module(module_name), attr)
        model = factory(num_classes=num_classes)
    else:
        import torchvision

        model = torchvision.models.get_model(spec, weights=None, num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{spec} did not return a torch.nn.Module")
    return model
