"""The zoo's networks (tuner/frontends/zoo.py) as plain PyTorch modules, for the peers.

Layer for layer the same graphs as the Relax zoo, with the same parameter names, so a zoo
``ModelSpec``'s weights load by name with ``strict=True``: a renamed, missing or extra
parameter fails loudly, and outputs that then disagree with TVM's mean the graphs differ.
The zoo's own twins, not torchvision's: their parameter names must be the zoo's, and torch
is the only dependency. (torchvision 0.28.0 installs beside torch 2.13.0, the ``vision`` extra;
``--model torchvision:NAME`` builds its networks, tuner/frontends/ecosystem.py.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tuner.frontends.model import ModelSpec


class BatchNorm2d(nn.Module):
    """Inference batch norm with weight, bias, running_mean and running_var only.

    ``torch.nn.BatchNorm2d`` also keeps ``num_batches_tracked``, which the zoo has no value for.
    """

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize NCHW channels by the running statistics."""
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False)


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1, act: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [_conv(in_ch, out_ch, kernel, stride, groups), BatchNorm2d(out_ch)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


def _downsample(in_ch: int, out_ch: int, stride: int) -> nn.Sequential | None:
    return None if stride == 1 and in_ch == out_ch else _conv_bn(in_ch, out_ch, 1, stride)


class BasicBlock(nn.Module):
    """ResNet-18/34 block."""

    expansion = 1

    def __init__(self, in_ch: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(in_ch, planes, 3, stride), BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, 1), BatchNorm2d(planes)
        self.downsample = _downsample(in_ch, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Two 3x3 convs plus the (projected) shortcut."""
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    """ResNet-50+ block, v1.5 (stride on the 3x3 conv)."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(in_ch, planes, 1, 1), BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, stride), BatchNorm2d(planes)
        self.conv3, self.bn3 = _conv(planes, planes * 4, 1, 1), BatchNorm2d(planes * 4)
        self.downsample = _downsample(in_ch, planes * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """1x1 reduce, 3x3, 1x1 expand, plus the (projected) shortcut."""
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """ResNet with the ImageNet head, as the zoo writes it."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int]) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(3, 64, 7, 2), BatchNorm2d(64)
        in_ch = 64
        stages = []
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            blocks = []
            for j in range(n):
                blocks.append(block(in_ch, planes, 2 if i > 0 and j == 0 else 1))
                in_ch = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(in_ch, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, 3, H, W) -> logits (N, 1000)."""
        y = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        y = self.layer4(self.layer3(self.layer2(self.layer1(y))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(in_ch * expand)
        self.use_res = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = [_conv_bn(in_ch, hidden, 1, 1, act=True)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=True), _conv(hidden, out_ch, 1, 1),
                   BatchNorm2d(out_ch)]  # fmt: skip
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block, with the residual where shapes allow it."""
        y = self.conv(x)
        return x + y if self.use_res else y


class MobileNetV2(nn.Module):
    """MobileNetV2, width 1.0; the classifier's dropout (index 0) is the identity."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        features: list[nn.Module] = [_conv_bn(3, 32, 3, 2, act=True)]
        in_ch = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(in_ch, c, s if i == 0 else 1, t))
                in_ch = c
        features.append(_conv_bn(in_ch, 1280, 1, 1, act=True))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Identity(), nn.Linear(1280, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, 3, H, W) -> logits (N, 1000)."""
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _Dense(nn.Module):
    """Hugging Face's Bert{Self,}Output (with LayerNorm) or BertIntermediate (GELU)."""

    def __init__(self, in_f: int, out_f: int, norm: bool) -> None:
        super().__init__()
        self.dense = nn.Linear(in_f, out_f)
        self.LayerNorm = nn.LayerNorm(out_f, eps=1e-12) if norm else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """dense(x), then LayerNorm(. + residual) or exact (erf) GELU."""
        y = self.dense(x)
        if self.LayerNorm is None:
            return F.gelu(y)
        return self.LayerNorm(y + residual)


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (f(x).reshape(b, s, self.heads, h // self.heads).permute(0, 2, 1, 3)
                   for f in (self.query, self.key, self.value))  # fmt: skip
        scores = torch.matmul(q, k.permute(0, 1, 3, 2)) * (1.0 / math.sqrt(h // self.heads))
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return ctx.permute(0, 2, 1, 3).reshape(b, s, h)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.self = _SelfAttention(hidden, heads)
        self.output = _Dense(hidden, hidden, norm=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertLayer(nn.Module):
    """Post-LN attention and GELU feed-forward sublayers."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attention = _Attention(hidden, heads)
        self.intermediate = _Dense(hidden, intermediate, norm=False)
        self.output = _Dense(intermediate, hidden, norm=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, seq, hidden)."""
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class _Embeddings(nn.Module):
    def __init__(self, vocab: int, positions: int, types: int, hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(types, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        positions = torch.arange(seq, dtype=torch.int64)
        token_types = torch.zeros(seq, dtype=torch.int64)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings(token_types))


class _Encoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.layer = nn.Sequential(*(BertLayer(hidden, heads, intermediate) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Bert(nn.Module):
    """BertModel without pooler; token type ids all 0, no attention mask."""

    def __init__(self, vocab: int = 30522, max_positions: int = 512, type_vocab: int = 2, hidden: int = 768,
                 layers: int = 12, heads: int = 12, intermediate: int = 3072) -> None:  # fmt: skip
        super().__init__()
        self.embeddings = _Embeddings(vocab, max_positions, type_vocab, hidden)
        self.encoder = _Encoder(layers, hidden, heads, intermediate)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) int64 -> last hidden state (batch, seq, hidden)."""
        return self.encoder(self.embeddings(input_ids))


class Tiny(nn.Module):
    """Two 3x3 convs, a global average and a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, 3, H, W) -> logits (N, 10)."""
        return self.fc(F.relu(self.conv2(F.relu(self.conv1(x)))).mean(dim=(2, 3)))


#: Zoo name -> constructor of the same network in PyTorch.
TORCH_ZOO: dict[str, Callable[[], nn.Module]] = {
    "resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
    "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]),
    "mobilenet_v2": MobileNetV2,
    "bert-base": Bert,
    "tiny": Tiny,
}


def torch_zoo_model(spec: ModelSpec) -> nn.Module:
    """The zoo model ``spec`` as a PyTorch module in eval mode, holding ``spec.params``.

    Raises:
        KeyError: ``spec`` is not a zoo model.
        RuntimeError: a parameter name or shape does not match (``load_state_dict(strict=True)``).
    """
    module = TORCH_ZOO[spec.name]()
    # Copied, not shared: torch must not write into the spec's arrays, and they may be read-only.
    state = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in spec.params.items()}
    module.load_state_dict(state, strict=True)
    return module.eval()
