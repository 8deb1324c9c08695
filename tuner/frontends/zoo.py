"""Built-in model zoo: classic networks written with ``tvm.relax.frontend.nn``.

The graphs follow torchvision (ResNet v1.5, MobileNetV2) and Hugging Face (BERT-base) layer
for layer, with the same parameter names (``layer1.0.conv1.weight``,
``encoder.layer.0.attention.self.query.weight``) and counts. Weights are random: tuning needs
shapes, and the values only have to keep activations finite and well scaled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tuner.errors import UnknownModelError
from tuner.frontends.model import ModelSpec

# Parameter.attrs keys read by _init_value and _export.
_INIT = "nightshift_init"  # "ones" | "zeros" | a float std; unset: zeros for 1-D, He-normal else
_GAIN = "nightshift_gain"  # multiplies the He-normal std
_BUFFER = "nightshift_buffer"  # running statistics: an argument, not a trainable weight

_BERT_INIT_STD = 0.02  # BERT's initializer_range


def _tag(param: nn.Parameter, **attrs: Any) -> nn.Parameter:
    param.attrs.update(attrs)
    return param


def _wrap(expr: relax.Expr, name: str) -> nn.Tensor:
    out = nn.op.wrap_nested(expr, name=name)
    assert isinstance(out, nn.Tensor)
    return out


# ----------------------------------------------------------------------------- layers


class BatchNorm2d(nn.Module):
    """``torch.nn.BatchNorm2d`` in eval mode: normalizes NCHW channels by running statistics."""

    def __init__(self, channels: int, dtype: str, eps: float = 1e-5) -> None:
        self.eps = eps
        self.weight = _tag(nn.Parameter((channels,), dtype), **{_INIT: "ones"})
        self.bias = _tag(nn.Parameter((channels,), dtype), **{_INIT: "zeros"})
        self.running_mean = _tag(nn.Parameter((channels,), dtype), **{_INIT: "zeros", _BUFFER: 1})
        self.running_var = _tag(nn.Parameter((channels,), dtype), **{_INIT: "ones", _BUFFER: 1})

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Normalize ``x`` (N, C, H, W)."""
        bn = relax.op.nn.batch_norm(
            x._expr,
            self.weight._expr,
            self.bias._expr,
            self.running_mean._expr,
            self.running_var._expr,
            axis=1,
            epsilon=self.eps,
            training=False,
        )
        # batch_norm returns (out, new_mean, new_var); inference only needs the first.
        return _wrap(relax.TupleGetItem(bn, 0), "batch_norm")


class Identity(nn.Module):
    """Stands in for layers that do nothing at inference (dropout), keeping torch's indices."""

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Return ``x``."""
        return x


class ReLU6(nn.Module):
    """``min(max(x, 0), 6)``."""

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Apply ReLU6."""
        return nn.op.relu6(x)


def _layer_norm(hidden: int, dtype: str) -> nn.LayerNorm:
    norm = nn.LayerNorm(hidden, eps=1e-12, dtype=dtype)
    assert norm.weight is not None
    _tag(norm.weight, **{_INIT: "ones"})
    return norm


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, dtype: str, groups: int = 1) -> nn.Conv2D:
    # torchvision's convs before a BN have no bias; "same" padding for odd kernels.
    return nn.Conv2D(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False, dtype=dtype)


def _conv_bn(
    in_ch: int,
    out_ch: int,
    kernel: int,
    stride: int,
    dtype: str,
    groups: int = 1,
    act: nn.Module | None = None,
) -> nn.ModuleList:
    """torchvision's Conv2dNormActivation: indices 0 (conv), 1 (bn), 2 (activation)."""
    layers = [_conv(in_ch, out_ch, kernel, stride, dtype, groups), BatchNorm2d(out_ch, dtype)]
    return nn.ModuleList([*layers, act] if act is not None else layers)


def _max_pool2d(x: nn.Tensor, size: int, stride: int, padding: int) -> nn.Tensor:
    return _wrap(
        relax.op.nn.max_pool2d(x._expr, pool_size=size, strides=stride, padding=padding),
        "max_pool2d",
    )


def _avg_pool_flatten(x: nn.Tensor) -> nn.Tensor:
    pooled = _wrap(relax.op.nn.adaptive_avg_pool2d(x._expr, output_size=1), "avg_pool")
    return nn.op.reshape(pooled, [x.shape[0], x.shape[1]], name="flatten")


# ----------------------------------------------------------------------------- ResNet


def _downsample(in_ch: int, out_ch: int, stride: int, dtype: str) -> nn.ModuleList | None:
    if stride == 1 and in_ch == out_ch:
        return None
    return _conv_bn(in_ch, out_ch, 1, stride, dtype)


class BasicBlock(nn.Module):
    """torchvision's ResNet-18/34 block."""

    expansion = 1

    def __init__(self, in_ch: int, planes: int, stride: int, dtype: str) -> None:
        self.conv1 = _conv(in_ch, planes, 3, stride, dtype)
        self.bn1 = BatchNorm2d(planes, dtype)
        self.conv2 = _conv(planes, planes, 3, 1, dtype)
        self.bn2 = BatchNorm2d(planes, dtype)
        self.downsample = _downsample(in_ch, planes, stride, dtype)

    @property
    def last_conv(self) -> nn.Conv2D:
        """The conv that closes the residual branch."""
        return self.conv2

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Two 3x3 convs plus the (projected) shortcut."""
        y = nn.op.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nn.op.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    """torchvision's ResNet-50+ block, v1.5: the stride sits on the 3x3 conv."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int, dtype: str) -> None:
        self.conv1 = _conv(in_ch, planes, 1, 1, dtype)
        self.bn1 = BatchNorm2d(planes, dtype)
        self.conv2 = _conv(planes, planes, 3, stride, dtype)
        self.bn2 = BatchNorm2d(planes, dtype)
        self.conv3 = _conv(planes, planes * 4, 1, 1, dtype)
        self.bn3 = BatchNorm2d(planes * 4, dtype)
        self.downsample = _downsample(in_ch, planes * 4, stride, dtype)

    @property
    def last_conv(self) -> nn.Conv2D:
        """The conv that closes the residual branch."""
        return self.conv3

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """1x1 reduce, 3x3, 1x1 expand, plus the (projected) shortcut."""
        y = nn.op.relu(self.bn1(self.conv1(x)))
        y = nn.op.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return nn.op.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """torchvision.models.ResNet with the ImageNet head (1000 classes)."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], dtype: str) -> None:
        self.conv1 = _conv(3, 64, 7, 2, dtype)
        self.bn1 = BatchNorm2d(64, dtype)
        in_ch = 64
        stages = []
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            blocks = []
            for j in range(n):
                blocks.append(block(in_ch, planes, 2 if i > 0 and j == 0 else 1, dtype))
                in_ch = planes * block.expansion
            stages.append(nn.ModuleList(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(in_ch, 1000, dtype=dtype)
        # With running stats 0/1 every BN is an identity, so nothing renormalizes the residual
        # stream: shrink each branch's closing conv (as Fixup does) or the stream's variance
        # compounds block after block (ResNet-50's logits reach ~1e3 at full He gain).
        gain = 1 / math.sqrt(sum(layers))
        for stage in stages:
            for blk in stage:
                _tag(blk.last_conv.weight, **{_GAIN: gain})

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Image batch (N, 3, H, W) -> logits (N, 1000)."""
        y = _max_pool2d(nn.op.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            y = stage(y)
        return self.fc(_avg_pool_flatten(y))


# ----------------------------------------------------------------------------- MobileNetV2


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int, dtype: str) -> None:
        hidden = round(in_ch * expand)
        self.use_res = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(in_ch, hidden, 1, 1, dtype, act=ReLU6()))
        layers += [
            _conv_bn(hidden, hidden, 3, stride, dtype, groups=hidden, act=ReLU6()),
            _conv(hidden, out_ch, 1, 1, dtype),
            BatchNorm2d(out_ch, dtype),
        ]
        self.conv = nn.ModuleList(layers)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """The block, with the residual where shapes allow it."""
        y = self.conv(x)
        return x + y if self.use_res else y


class MobileNetV2(nn.Module):
    """torchvision.models.MobileNetV2, width 1.0; dropout is the identity at inference."""

    # (expansion t, channels c, repeats n, first stride s), as in the paper and torchvision.
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, dtype: str) -> None:
        features: list[nn.Module] = [_conv_bn(3, 32, 3, 2, dtype, act=ReLU6())]
        in_ch = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(in_ch, c, s if i == 0 else 1, t, dtype))
                in_ch = c
        features.append(_conv_bn(in_ch, 1280, 1, 1, dtype, act=ReLU6()))
        self.features = nn.ModuleList(features)
        # Index 0 is torchvision's Dropout(0.2), a no-op at inference.
        self.classifier = nn.ModuleList([Identity(), nn.Linear(1280, 1000, dtype=dtype)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Image batch (N, 3, H, W) -> logits (N, 1000)."""
        return self.classifier(_avg_pool_flatten(self.features(x)))


# ----------------------------------------------------------------------------- BERT


def _bert_linear(in_f: int, out_f: int, dtype: str) -> nn.Linear:
    layer = nn.Linear(in_f, out_f, dtype=dtype)
    _tag(layer.weight, **{_INIT: _BERT_INIT_STD})
    return layer


class _Dense(nn.Module):
    """Hugging Face's Bert{Self,}Output / BertIntermediate: dense (+ residual and LayerNorm)."""

    def __init__(self, in_f: int, out_f: int, dtype: str, norm: bool) -> None:
        self.dense = _bert_linear(in_f, out_f, dtype)
        self.LayerNorm = _layer_norm(out_f, dtype) if norm else None  # Hugging Face's name

    def forward(self, x: nn.Tensor, residual: nn.Tensor | None = None) -> nn.Tensor:
        """dense(x), then LayerNorm(. + residual) for the output sublayers, GELU otherwise."""
        y = self.dense(x)
        if self.LayerNorm is None:
            return nn.op.gelu(y)
        assert residual is not None
        return self.LayerNorm(y + residual)


class _SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, every token attended (no mask)."""

    def __init__(self, hidden: int, heads: int, dtype: str) -> None:
        self.heads = heads
        self.query = _bert_linear(hidden, hidden, dtype)
        self.key = _bert_linear(hidden, hidden, dtype)
        self.value = _bert_linear(hidden, hidden, dtype)

    def _split_heads(self, x: nn.Tensor) -> nn.Tensor:
        b, s, h = x.shape
        return nn.op.permute_dims(nn.op.reshape(x, [b, s, self.heads, h // self.heads]), [0, 2, 1, 3])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """(batch, seq, hidden) -> context (batch, seq, hidden)."""
        b, s, h = x.shape
        q, k, v = (self._split_heads(f(x)) for f in (self.query, self.key, self.value))
        scale = nn.Tensor.from_scalar(1.0 / math.sqrt(h // self.heads), x.dtype)
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) * scale
        ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        return nn.op.reshape(nn.op.permute_dims(ctx, [0, 2, 1, 3]), [b, s, h])


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, dtype: str) -> None:
        self.self = _SelfAttention(hidden, heads, dtype)
        self.output = _Dense(hidden, hidden, dtype, norm=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.output(self.self(x), x)


class BertLayer(nn.Module):
    """Hugging Face's BertLayer: post-LN attention and GELU feed-forward sublayers."""

    def __init__(self, hidden: int, heads: int, intermediate: int, dtype: str) -> None:
        self.attention = _Attention(hidden, heads, dtype)
        self.intermediate = _Dense(hidden, intermediate, dtype, norm=False)
        self.output = _Dense(intermediate, hidden, dtype, norm=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """(batch, seq, hidden) -> (batch, seq, hidden)."""
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class _Embeddings(nn.Module):
    def __init__(self, vocab: int, positions: int, types: int, hidden: int, dtype: str) -> None:
        self.word_embeddings = nn.Embedding(vocab, hidden, dtype=dtype)
        self.position_embeddings = nn.Embedding(positions, hidden, dtype=dtype)
        self.token_type_embeddings = nn.Embedding(types, hidden, dtype=dtype)
        for emb in (self.word_embeddings, self.position_embeddings, self.token_type_embeddings):
            _tag(emb.weight, **{_INIT: _BERT_INIT_STD})
        self.LayerNorm = _layer_norm(hidden, dtype)  # Hugging Face's name

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        seq = int(input_ids.shape[1])
        positions = nn.Tensor.from_const(np.arange(seq, dtype="int64"))
        token_types = nn.Tensor.from_const(np.zeros(seq, dtype="int64"))
        # The (seq, hidden) rows broadcast over the batch.
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_types)
        )
        return self.LayerNorm(x)


class _Encoder(nn.Module):
    def __init__(self, layers: list[BertLayer]) -> None:
        self.layer = nn.ModuleList(layers)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.layer(x)


class Bert(nn.Module):
    """Hugging Face's BertModel without pooler; token type ids are all 0, no attention mask."""

    def __init__(
        self,
        dtype: str,
        vocab: int = 30522,
        max_positions: int = 512,
        type_vocab: int = 2,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        intermediate: int = 3072,
    ) -> None:
        self.embeddings = _Embeddings(vocab, max_positions, type_vocab, hidden, dtype)
        self.encoder = _Encoder([BertLayer(hidden, heads, intermediate, dtype) for _ in range(layers)])

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        """Token ids (batch, seq) int64 -> last hidden state (batch, seq, hidden)."""
        return self.encoder(self.embeddings(input_ids))


# ----------------------------------------------------------------------------- tiny


class Tiny(nn.Module):
    """Two 3x3 convs, a global average and a dense layer: compiles and tunes in seconds."""

    def __init__(self, dtype: str) -> None:
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1, dtype=dtype)
        self.conv2 = nn.Conv2D(8, 8, 3, padding=1, dtype=dtype)
        self.fc = nn.Linear(8, 10, dtype=dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        """Image batch (N, 3, H, W) -> logits (N, 10)."""
        y = nn.op.relu(self.conv2(nn.op.relu(self.conv1(x))))
        return self.fc(_wrap(relax.op.mean(y._expr, axis=[2, 3]), "global_avg"))


# ----------------------------------------------------------------------------- export


def _init_value(param: nn.Parameter, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(int(d) for d in param.shape)
    init = param.attrs.get(_INIT)
    if init == "ones":
        value = np.ones(shape, dtype=np.float32)
    elif init == "zeros" or (init is None and len(shape) == 1):
        value = np.zeros(shape, dtype=np.float32)
    else:
        if init is None:
            # He-normal (fan_in = in_ch/groups * kh * kw) keeps the scale through ReLUs.
            std = math.sqrt(2.0 / math.prod(shape[1:])) * float(param.attrs.get(_GAIN, 1.0))
        else:
            std = float(init)
        # Drawn in float32: several times faster than float64 for BERT's 109M values.
        value = rng.standard_normal(shape, dtype=np.float32)
        value *= np.float32(std)
    return value.astype(param.dtype, copy=False)


def _export(name: str, model: nn.Module, inputs: dict[str, tuple[tuple[int, ...], str]], seed: int) -> ModelSpec:
    """Export ``model.forward`` as ``main`` with seeded random values for every weight."""
    spec = {"forward": {k: nn.spec.Tensor(shape, dtype) for k, (shape, dtype) in inputs.items()}}
    mod, named_params = model.export_tvm(spec=spec)
    main = mod["forward"].with_attr("global_symbol", "main")
    funcs = {gv.name_hint: mod[gv] for gv in mod.get_global_vars() if gv.name_hint != "forward"}
    funcs["main"] = main
    out_mod = tvm.IRModule(funcs, attrs=mod.attrs)

    arg_names = [v.name for v in main.params[len(inputs) :]]
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    trainable = 0
    for arg_name, (_, param) in zip(arg_names, named_params, strict=True):
        params[arg_name] = value = _init_value(param, rng)
        if not param.attrs.get(_BUFFER):
            trainable += value.size
    return ModelSpec(name=name, mod=out_mod, params=params, num_parameters=trainable)


def _image(batch_size: int, dtype: str, size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {"x": ((batch_size, 3, size, size), dtype)}


def resnet18(*, batch_size: int = 1, dtype: str = "float32", image_size: int = 224) -> ModelSpec:
    """torchvision ResNet-18: 11,689,512 parameters."""
    model = ResNet(BasicBlock, [2, 2, 2, 2], dtype)
    return _export("resnet18", model, _image(batch_size, dtype, image_size), seed=18)


def resnet50(*, batch_size: int = 1, dtype: str = "float32", image_size: int = 224) -> ModelSpec:
    """torchvision ResNet-50 (v1.5): 25,557,032 parameters."""
    model = ResNet(Bottleneck, [3, 4, 6, 3], dtype)
    return _export("resnet50", model, _image(batch_size, dtype, image_size), seed=50)


def mobilenet_v2(*, batch_size: int = 1, dtype: str = "float32", image_size: int = 224) -> ModelSpec:
    """torchvision MobileNetV2, width 1.0: 3,504,872 parameters."""
    model = MobileNetV2(dtype)
    return _export("mobilenet_v2", model, _image(batch_size, dtype, image_size), seed=2)


def bert_base(*, batch_size: int = 1, dtype: str = "float32", seq_len: int = 128) -> ModelSpec:
    """BERT-base encoder without pooler, int64 token ids in: 108,891,648 parameters."""
    if not 1 <= seq_len <= 512:
        raise ValueError(f"bert-base takes 1 to 512 tokens, got seq_len={seq_len}")
    inputs = {"input_ids": ((batch_size, seq_len), "int64")}
    return _export("bert-base", Bert(dtype), inputs, seed=768)


def tiny(*, batch_size: int = 1, dtype: str = "float32", image_size: int = 16) -> ModelSpec:
    """A 898-parameter CNN on 3x16x16 images with 10 outputs, for tests."""
    return _export("tiny", Tiny(dtype), _image(batch_size, dtype, image_size), seed=0)


ZOO: dict[str, Callable[..., ModelSpec]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert-base": bert_base,
    "tiny": tiny,
}


def zoo_names() -> list[str]:
    """The names :func:`build_zoo_model` accepts, sorted."""
    return sorted(ZOO)


def build_zoo_model(name: str, *, batch_size: int = 1, dtype: str = "float32", **options: Any) -> ModelSpec:
    """Build zoo model ``name``; ``options`` go to its builder (``seq_len``, ``image_size``)."""
    try:
        builder = ZOO[name]
    except KeyError:
        raise UnknownModelError(f"unknown zoo model {name!r}; known models: {', '.join(zoo_names())}") from None
    return builder(batch_size=batch_size, dtype=dtype, **options)
