# SPDX-License-Identifier: Apache-2.0
"""PyTorch, when the process has it: direct tensor reads and the current stream.

flashdecode never imports PyTorch. Once PyTorch is imported (before or after
flashdecode), the first look at it (:func:`get`) caches what the hot path
needs (``torch.Tensor``, its dtypes, the raw current-stream getter). Without
PyTorch, :func:`get` is one dictionary look-up that finds nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Optional


class TorchState:
    """What the binding uses of an imported ``torch``, looked up once."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.Tensor: Any = torch.Tensor
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.current_stream: Callable[[int], int] = (
            raw if raw is not None else (lambda index: int(torch.cuda.current_stream(index).cuda_stream))
        )
        # fd_dtype values (pinned by the C API); 16-bit integers may hold the bits of a 16-bit float.
        self.dtypes: Dict[Any, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}
        self.raw_16_bit = {torch.int16} | ({torch.uint16} if hasattr(torch, "uint16") else set())


state: Optional[TorchState] = None
_setup_lock = threading.RLock()


def get() -> Optional[TorchState]:
    """The :class:`TorchState` if PyTorch is imported in this process, else None (never imports it)."""
    found = state
    if found is not None:
        return found
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor") or not hasattr(torch, "_C"):
        return None  # absent, or still importing
    return _setup(torch)


def _setup(torch: Any) -> TorchState:
    global state
    with _setup_lock:
        if state is None:
            state = TorchState(torch)
        return state
