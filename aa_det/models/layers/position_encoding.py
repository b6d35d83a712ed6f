"""Absolute position encodings for the AA paper's ablation (Bello et al., 2019,
Tables 6-7).

Both are computed for the input's own size, so they work at any feature size.
"""
import torch
from torch import Tensor


def sine_encoding_2d(height: int,
                     width: int,
                     channels: int,
                     device=None,
                     dtype=None) -> Tensor:
    """2D sinusoidal encoding (Image Transformer style): half the channels
    encode the row, half the column, each with ``sin`` / ``cos`` at geometric
    frequencies.

    Returns:
        Tensor: ``[channels, height, width]``; channels beyond a multiple of 4
        are 0.
    """
    quarter = channels // 4
    enc = torch.zeros(channels, height, width, device=device, dtype=dtype)
    if quarter == 0:
        return enc
    freq = 1.0 / (10000**(
        torch.arange(quarter, device=device, dtype=torch.float32) / quarter))
    # [H, C/4]
    ys = torch.arange(
        height, device=device, dtype=torch.float32)[:, None] * freq
    # [W, C/4]
    xs = torch.arange(
        width, device=device, dtype=torch.float32)[:, None] * freq
    enc[0 * quarter:1 * quarter] = ys.sin().t()[:, :, None].to(enc.dtype)
    enc[1 * quarter:2 * quarter] = ys.cos().t()[:, :, None].to(enc.dtype)
    enc[2 * quarter:3 * quarter] = xs.sin().t()[:, None, :].to(enc.dtype)
    enc[3 * quarter:4 * quarter] = xs.cos().t()[:, None, :].to(enc.dtype)
    return enc


def coord_channels(x: Tensor) -> Tensor:
    """CoordConv (Liu et al., 2018): append x, y in [-1, 1] and r = sqrt(x^2 +
    y^2).

    Args:
        x (Tensor): ``[B, C, H, W]``.

    Returns:
        Tensor: ``[B, C + 3, H, W]``.
    """
    B, _, H, W = x.shape
    ys = torch.linspace(
        -1, 1, H, device=x.device, dtype=x.dtype)[:, None].expand(H, W)
    xs = torch.linspace(
        -1, 1, W, device=x.device, dtype=x.dtype)[None, :].expand(H, W)
    coords = torch.stack([xs, ys, (xs**2 + ys**2).sqrt()])  # [3, H, W]
    return torch.cat([x, coords.expand(B, 3, H, W)], dim=1)
