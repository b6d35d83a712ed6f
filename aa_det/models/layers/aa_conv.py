"""Attention augmented convolution.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, Sec. 3 and Fig. 2:
``AAConv(X) = Concat[Conv(X), MHA(X)]``, ``out_channels - dv`` conv filters and ``dv`` attention channels.

Example:
    >>> import torch
    >>> conv = AAConv2d(64, 64, 3, key_ratio=0.25, value_ratio=0.25, num_heads=4,
    ...                 min_key_dim_per_head=4)
    >>> conv(torch.rand(2, 64, 9, 13)).shape
    torch.Size([2, 64, 9, 13])
    >>> AAConv2d(64, 64, 3, stride=2, num_heads=4)(torch.rand(1, 64, 9, 13)).shape
    torch.Size([1, 64, 5, 7])
"""
import numbers
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_conv_layer
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from ...utils.compat import autocast_dtype
from .kernel_policy import cast_together, graph_mode
from .position_encoding import coord_channels, sine_encoding_2d
from .relative_attention import IMPLS, relative_attention
from .relative_position import TrainedOffsetRange, reset_relative_tables

POSITION_ENCODINGS = ('relative', 'none', 'sine', 'coord')


def round_to_heads(channels: float, num_heads: int) -> int:
    """Round to the nearest positive multiple of ``num_heads``."""
    return max(num_heads, int(round(channels / num_heads)) * num_heads)


def aa_channels(out_channels: int, key_ratio: float, value_ratio: float, num_heads: int,
                min_key_dim_per_head: int):
    """Key depth ``dk`` and value depth ``dv`` of an AA conv (see docs/design.md).

    ``dk = max(round(kappa * F_out), min_key_dim_per_head * Nh)`` and
    ``dv = min(round(upsilon * F_out), F_out)``, rounded to multiples of ``Nh``.
    This reading reproduces the AA paper's parameter counts (Tables 2, 5 and 9).
    """
    if num_heads < 1:
        raise ValueError(f'AAConv2d: num_heads must be >= 1, got {num_heads}')
    dk = max(round_to_heads(key_ratio * out_channels, num_heads), min_key_dim_per_head * num_heads)
    dv = min(round_to_heads(value_ratio * out_channels, num_heads), out_channels)
    return dk, dv


@MODELS.register_module('AAConv')
class AAConv2d(BaseModule):
    """Attention augmented convolution (AA paper, Sec. 3.3, Fig. 2).

    Has ``nn.Conv2d``'s signature so ``build_conv_layer`` builds it from ``dict(type='AAConv', ...)``.

    Args:
        in_channels (int): ``F_in``.
        out_channels (int): ``F_out`` of the convolution it replaces.
        kernel_size (int): kernel of the convolutional part. Defaults to 3.
        stride (int): 1 or 2: the convolution is strided, the attention input pooled (3x3 average,
            same stride) to the same output size. Defaults to 1.
        padding (int, optional): None or 'same' padding, ``dilation * (kernel_size - 1) // 2``; other
            values are refused. Defaults to None.
        dilation (int): dilation of the convolutional part. Defaults to 1.
        groups (int): must be 1.
        bias (bool): bias of the convolutional part. Defaults to False.
        key_ratio (float): ``kappa = dk / F_out``, at least 0. Defaults to 0.2.
        value_ratio (float): ``upsilon = dv / F_out``, in ``(0, 1]`` (1.0: fully attentional; below 1, ``dv``
            must round to fewer than ``out_channels``). Defaults to 0.1.
        num_heads (int): ``Nh``, at least 1. Defaults to 8.
        min_key_dim_per_head (int): lower bound on ``dkh`` (the paper's 20). Defaults to 20.
        key_channels (int, optional): explicit ``dk``, overrides ``key_ratio``.
        value_channels (int, optional): explicit ``dv``, overrides ``value_ratio``.
        position (str): 'relative' (eq. (3)), 'none', 'sine' (2D sinusoids added to the attention input)
            or 'coord' (CoordConv x, y, r channels appended to it). Defaults to 'relative'.
        max_rel_dist (int): relative tables cover offsets up to ``max_rel_dist - 1``; larger ones clip (at test
            time, at the largest trained offset: :class:`TrainedOffsetRange`). Defaults to 64.
        attn_downsample (bool): 3x3 average pool (stride 2) before the attention and bilinear
            upsampling after it. Defaults to False.
        impl (str): attention kernel, see :func:`relative_attention`. Defaults to 'auto'.
        conv_cfg (dict, optional): ``build_conv_layer`` config of the convolutional part, e.g.
            ``dict(type='DCN', deform_groups=1)``. Defaults to None (``nn.Conv2d``).
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: Optional[int] = None, dilation: int = 1, groups: int = 1, bias: bool = False,
                 key_ratio: float = 0.2, value_ratio: float = 0.1, num_heads: int = 8, min_key_dim_per_head: int = 20,
                 key_channels: Optional[int] = None, value_channels: Optional[int] = None, position: str = 'relative',
                 max_rel_dist: int = 64, attn_downsample: bool = False, impl: str = 'auto',
                 conv_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        if key_channels is None and key_ratio < 0:
            raise ValueError(f'AAConv2d: key_ratio must be >= 0, got {key_ratio}')
        if value_channels is None and not 0 < value_ratio <= 1:  # above 1, dv's clip made it 1.0 unsaid
            raise ValueError(f'AAConv2d: value_ratio must be in (0, 1] (1.0: fully attentional), got {value_ratio}')
        dk, dv = aa_channels(out_channels, key_ratio, value_ratio, num_heads, min_key_dim_per_head)
        dk = dk if key_channels is None else key_channels
        dv = dv if value_channels is None else value_channels
        for name, value in (('key_channels (dk)', dk), ('value_channels (dv)', dv)):
            if value <= 0 or value % num_heads:
                raise ValueError(f'AAConv2d: {name}={value} must be a positive multiple of num_heads={num_heads}')
        if dv > out_channels:
            raise ValueError(f'AAConv2d: value_channels (dv)={dv} exceeds out_channels={out_channels}')
        if dv == out_channels and value_channels is None and value_ratio < 1:
            raise ValueError(f'AAConv2d: value_ratio={value_ratio} of out_channels={out_channels} rounds to dv={dv} (a '
                             f'multiple of num_heads={num_heads}), which leaves no convolutional channels; use more '
                             f'out_channels or fewer heads, or value_ratio=1.0 for a fully attentional layer')
        for name, value, allowed in (('position', position, POSITION_ENCODINGS), ('stride', stride, (1, 2)),
                                     ('groups', groups, (1,)), ('impl', impl, IMPLS)):
            if value not in allowed:
                raise ValueError(f'AAConv2d: {name} must be one of {allowed}, got {value!r}')
        if kernel_size % 2 != 1:
            raise ValueError(f'AAConv2d: kernel_size must be odd, got {kernel_size}')
        same = dilation * (kernel_size - 1) // 2
        if padding not in (None, same):
            raise ValueError(f"AAConv2d: padding={padding} is not supported: the attention branch keeps 'same' "
                             f"padding, {same} for kernel_size={kernel_size} and dilation={dilation} (or None)")
        if not isinstance(max_rel_dist, numbers.Integral) or max_rel_dist < 1:  # it sizes the tables
            raise ValueError(f'AAConv2d: max_rel_dist must be an int >= 1, got {max_rel_dist!r}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.num_heads = stride, num_heads
        self.key_channels, self.value_channels = dk, dv
        self.head_dim = dk // num_heads
        # a float, computed once: torch 2.4 - 2.5 make the int attribute symbolic under dynamic=True,
        # and torch 2.4 guards on `head_dim ** -0.5` with a ToFloat that never passes: a recompile per size
        self.scale = self.head_dim ** -0.5
        self.position, self.attn_downsample, self.impl = position, attn_downsample, impl

        conv_channels = out_channels - dv
        self.conv = build_conv_layer(conv_cfg, in_channels, conv_channels, kernel_size, stride, same, dilation,
                                     bias=bias) if conv_channels > 0 else None
        attn_in = in_channels + 3 if position == 'coord' else in_channels
        self.qkv = nn.Conv2d(attn_in, 2 * dk + dv, 1)  # one 1x1 conv for k, q, v (Fig. 2)
        self.proj = nn.Conv2d(dv, dv, 1)  # W^O mixes the heads, eq. (2)
        if position == 'relative':
            self.rel_h = nn.Parameter(torch.empty(2 * max_rel_dist - 1, self.head_dim))
            self.rel_w = nn.Parameter(torch.empty(2 * max_rel_dist - 1, self.head_dim))
            self.offset_range = TrainedOffsetRange(max_rel_dist)  # offsets (h, w) trained so far
            reset_relative_tables(self, 'rel_h', 'rel_w')

    def relative_tables(self, h: int, w: int):
        """The rows of ``rel_h`` / ``rel_w`` an ``h x w`` attention grid may use (:class:`TrainedOffsetRange`),
        ``[2 mh - 1, dkh]`` and ``[2 mw - 1, dkh]``; ``(None, None)`` without relative position."""
        if self.position != 'relative':
            return None, None
        return self.offset_range.crop(self.rel_h, 0, h), self.offset_range.crop(self.rel_w, 1, w)

    def init_weights(self):
        super().init_weights()
        reset_relative_tables(self, 'rel_h', 'rel_w')  # none without relative position

    def attention_input(self, x: Tensor) -> Tensor:
        """Strided / downsampled input of the attention branch, with absolute
        position encodings when selected."""
        if self.stride > 1:
            x = F.avg_pool2d(x, 3, self.stride, 1)
        if self.attn_downsample:
            x = F.avg_pool2d(x, 3, 2, 1)
        if self.position == 'sine':
            x = x + sine_encoding_2d(*x.shape[-2:], x.shape[1], x.device, x.dtype)
        elif self.position == 'coord':
            x = coord_channels(x)
        return x

    def conv_params(self, device_type: str) -> dict:
        """Weight and bias of ``qkv``, ``proj`` and the convolutional part (an ``nn.Conv2d``) as this pass uses them,
        by name: under autocast cast in one op, and their gradients back in one (:func:`cast_together`), else the
        parameters themselves."""
        convs = {name: conv for name, conv in (('qkv', self.qkv), ('proj', self.proj), ('conv', self.conv))
                 if type(conv) is nn.Conv2d}  # not a subclass: one may change its weight in forward (ConvWS)
        params = {(name, kind): p for name, conv in convs.items()
                  for kind, p in (('weight', conv.weight), ('bias', conv.bias)) if p is not None}
        amp = autocast_dtype(device_type)
        if amp is not None and amp != self.qkv.weight.dtype:
            params = dict(zip(params, cast_together(list(params.values()), amp)))
        return {name: (params[name, 'weight'], params.get((name, 'bias'))) for name in convs}

    def qkv_heads(self, x: Tensor, params: Optional[tuple] = None):
        """Queries, keys and values per head from the attention input ``x`` ``[B, C, h, w]``, through ``qkv``'s
        weight and bias ``params`` (:meth:`conv_params`; default: the parameters): ``q, k`` ``[B, Nh, hw, dkh]``,
        ``v`` ``[B, Nh, hw, dvh]``, ``(h, w)``. The logits' factor ``dkh ** -0.5`` is ``self.scale``, applied by the
        kernel."""
        h, w = x.shape[-2:]
        sizes = (self.key_channels, self.key_channels, self.value_channels)
        qkv = self.qkv._conv_forward(x, *(params or (self.qkv.weight, self.qkv.bias)))  # [B, 2 dk + dv, h, w]: k, q, v
        k, q, v = (t.reshape(t.shape[0], self.num_heads, -1, h * w).transpose(-1, -2)  # [B, Nh, hw, d]: views
                   for t in qkv.split(sizes, 1))
        return q, k, v, (h, w)

    def forward(self, x: Tensor) -> Tensor:
        out_size = (x.shape[-2] - 1) // self.stride + 1, (x.shape[-1] - 1) // self.stride + 1
        params = self.conv_params(x.device.type)
        q, k, v, (h, w) = self.qkv_heads(self.attention_input(x), params['qkv'])
        attn = relative_attention(q, k, v, *self.relative_tables(h, w), h, w, impl=self.impl,
                                  scale=self.scale)  # [B, Nh, hw, dvh]
        attn = self._project(attn, h, w, *params['proj'])  # [B, dv, h, w]
        if (h, w) != out_size:
            attn = F.interpolate(attn, size=out_size, mode='bilinear', align_corners=False)
        if self.conv is None:
            return attn
        conv = self.conv._conv_forward(x, *params['conv']) if 'conv' in params else self.conv(x)
        return torch.cat([conv, attn], dim=1)  # [B, F_out, H / s, W / s]

    def _project(self, attn: Tensor, h: int, w: int, weight: Tensor, bias: Tensor) -> Tensor:
        """``W^O`` (``proj``, a 1x1 conv of ``weight`` and ``bias``) on the heads' outputs ``[B, Nh, hw, dvh]``.

        In a captured graph, one GEMM: the conv's saved reshaped view has strides inductor cannot order with
        dynamic shapes (torch 2.14.1; docs/design.md, "Compiling and exporting").

        Returns:
            Tensor: ``[B, dv, h, w]``.
        """
        if graph_mode():
            weight = weight.view(self.value_channels, self.num_heads, -1)  # [dv, Nh, dvh]
            out = torch.einsum('bnpc,onc->bop', attn, weight)  # [B, dv, hw]
            return out.unflatten(-1, (h, w)) + bias.to(out.dtype).view(-1, 1, 1)  # autocast's dtype, as the conv's
        return self.proj._conv_forward(attn.transpose(-1, -2).reshape(attn.shape[0], self.value_channels, h, w),
                                       weight, bias)
