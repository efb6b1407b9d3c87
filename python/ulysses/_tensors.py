"""torch tensors as the library's strided [b, s, h, d] views: (data pointer, dtype, shape,
strides). Nothing is copied unless the last dimension is not contiguous."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from ._ulysses import Error

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def check(t: torch.Tensor, name: str) -> None:
    """Raises Error unless the library can take ``t`` (a 4-D float32 or bfloat16 CPU tensor).
    Not collective: callers agree it (``_agree.agreed``) before the library's collectives."""
    if not isinstance(t, torch.Tensor):
        raise Error(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise Error(
            f"{name} is on {t.device}; ulysses runs on CPU tensors: move them with .cpu() (the output back with "
            ".to(device)), or keep DeepSpeed's module for GPU tensors"
        )
    if t.dtype not in _DTYPES:
        raise Error(
            f"{name} has dtype {t.dtype}; ulysses takes torch.float32 or torch.bfloat16: convert with .float() "
            "or .bfloat16() (and the output back with .to(dtype))"
        )
    if t.dim() != 4:
        raise Error(f"{name} must be 4-D [b, s, h, d], got shape {tuple(t.shape)}")


def readable(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` if the library can read it in place, else a contiguous copy."""
    check(t, name)
    return t if t.stride(3) == 1 or t.size(3) == 1 else t.contiguous()


def spec(t: torch.Tensor) -> Tuple[int, str, Tuple[int, ...], Tuple[int, int, int]]:
    """The view tuple of a tensor that ``readable`` accepted."""
    return (t.data_ptr(), _DTYPES[t.dtype], tuple(t.shape), (t.stride(0), t.stride(1), t.stride(2)))


def from_buffer(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor sharing the memory of a numpy array from the library (int16 bits for bf16)."""
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
