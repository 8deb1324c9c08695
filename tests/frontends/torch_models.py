"""PyTorch factories for the frontend tests (``--model tests.frontends.torch_models:small_cnn``)."""

import torch


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(y)


def small_cnn(batch_size: int = 1):
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(batch_size, 3, 16, 16),)


def not_a_factory():
    return 42
