# SPDX-License-Identifier: Apache-2.0
"""PyTorch, when the process has it: direct tensor reads, the current stream, and the custom op.

flashdecode never imports PyTorch. Once PyTorch is imported (before or after
flashdecode), the first look at it (:func:`get`) caches what the hot path
needs (``torch.Tensor``, its dtypes, the raw current-stream getter) and
registers ``torch.ops.flashdecode.decode`` (PyTorch 2.4 and later), so that
decodes work inside ``torch.compile`` and captured CUDA graphs. Without
PyTorch, :func:`get` is one dictionary look-up that finds nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Optional, Tuple


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
        self.dtypes[torch.int8] = 6
        for name, code in (("float8_e4m3fn", 4), ("float8_e5m2", 5)):  # PyTorch 2.1+
            if hasattr(torch, name):
                self.dtypes[getattr(torch, name)] = code
        self.raw_16_bit = {torch.int16} | ({torch.uint16} if hasattr(torch, "uint16") else set())
        self.raw_8_bit = {torch.uint8}  # 8-bit cache storage: dtype= names it
        self.op: Any = None  # torch.ops.flashdecode.decode, once registered


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
    return _set_up(torch)


def _set_up(torch: Any) -> TorchState:
    global state
    with _setup_lock:
        if state is None:
            created = TorchState(torch)
            state = created
            created.op = _register_op(torch)
        return state


def compiling(torch: Any) -> bool:
    """Whether ``torch.compile`` (dynamo) is tracing: True there, as a constant, False when running."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and bool(compiler.is_compiling())


def op_available() -> bool:
    """Registers ``torch.ops.flashdecode.decode`` if it is not yet; whether it exists (PyTorch 2.4+)."""
    found = get()
    return found is not None and found.op is not None


# The first look at PyTorch can happen inside torch.compile's trace (flashdecode
# imported before torch, and the first call compiled): dynamo can neither trace
# a lock nor an op's registration. This mark, the one that
# torch.compiler.assume_constant_result sets, makes dynamo call the function
# for real at trace time and keep its result (a bool) as a constant.
op_available._dynamo_marked_constant = True  # type: ignore[attr-defined]


def require() -> TorchState:
    """The :class:`TorchState`, importing PyTorch (for :func:`flashdecode.torch_op`)."""
    found = get()
    if found is None:
        import torch  # noqa: F401  (the caller asked for PyTorch)

        found = get()
        assert found is not None
    return found


# ---- torch.ops.flashdecode.decode --------------------------------------------

OP_NAME = "flashdecode::decode"


def _register_op(torch: Any) -> Any:
    """Defines ``flashdecode::decode`` with its fake (meta) implementation; None before PyTorch 2.4."""
    library = getattr(torch, "library", None)
    if library is None or not hasattr(library, "custom_op") or not hasattr(library, "register_fake"):
        return None
    try:
        return torch.ops.flashdecode.decode  # defined by an earlier copy of this module (a reload): keep it
    except (AttributeError, RuntimeError):
        pass
    Tensor = torch.Tensor

    # custom_op infers the schema from the annotations: set as real types
    # below, not the strings that `from __future__ import annotations` leaves.
    def decode(
        q: Any,
        k: Any,
        v: Any,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        layout: str = "NHD",
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
    ) -> Tuple[Any, Any]:
        from ._functions import op_decode

        return op_decode(
            q, k, v, seq_lens, block_table, softmax_scale, num_splits, layout, split_tokens, causal, window_left,
            logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens,
        )  # fmt: skip

    decode.__annotations__ = {
        "q": Tensor,
        "k": Tensor,
        "v": Tensor,
        "seq_lens": Optional[Tensor],
        "block_table": Optional[Tensor],
        "softmax_scale": Optional[float],
        "num_splits": Optional[int],
        "layout": str,
        "split_tokens": Optional[int],
        "causal": bool,
        "window_left": Optional[int],
        "logit_softcap": Optional[float],
        "alibi_slopes": Optional[Tensor],
        "sinks": Optional[Tensor],
        "k_scale": Optional[Tensor],
        "v_scale": Optional[Tensor],
        "q_lens": Optional[Tensor],
        "return": Tuple[Tensor, Tensor],
    }
    op = library.custom_op(OP_NAME, mutates_args=())(decode)

    def fake(
        q: Any,
        k: Any,
        v: Any,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Any = None,
        num_splits: Any = None,
        layout: str = "NHD",
        split_tokens: Any = None,
        causal: Any = True,
        window_left: Any = None,
        logit_softcap: Any = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
    ) -> Tuple[Any, Any]:
        if q.dim() not in (3, 4):
            from ._errors import InvalidShapeError, refuse

            raise refuse(InvalidShapeError, f"q: expected 3 or 4 dimensions, got shape {tuple(q.shape)}")
        return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)

    library.register_fake(OP_NAME)(fake)
    del op  # called through torch.ops, which torch.compile knows
    return torch.ops.flashdecode.decode
