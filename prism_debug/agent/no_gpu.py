"""Recognising a rank that dies on a CUDA call the machine cannot serve.

prism-debug emulates the other ranks, not a GPU: a script that calls
``torch.cuda.set_device(LOCAL_RANK)`` on a CPU-only machine ends in
``AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'`` —
torch's words for "built without CUDA", which name neither the cause nor the
user's line.  The rank's excepthook recognises torch's no-GPU failures and
writes a ``no_gpu`` event naming the user's file, line and the call; the
controller turns it into one line (``process/start.py``).  The hook only
looks: the exception is reported by the hooks before it as ever.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Callable
from types import TracebackType

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PRISM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# (exception type, words in its message) torch raises where a GPU is missing
_NO_GPU = (
    (AttributeError, "torch._C' has no attribute '_cuda"),  # built without CUDA
    (AssertionError, "Torch not compiled with CUDA enabled"),
    (RuntimeError, "Found no NVIDIA driver"),
    (RuntimeError, "No CUDA GPUs are available"),
    (RuntimeError, "requires CUDA support"),
)


def no_gpu_event(error: BaseException) -> dict | None:
    """The ``no_gpu`` event for ``error`` if torch raised it for want of a
    GPU: the user's frame that made the call (the last outside torch and
    prism-debug), the public torch function it called where there is one,
    and why there is no GPU.  None for any other error."""
    text = str(error)
    if not any(isinstance(error, kind) and words in text for kind, words in _NO_GPU):
        return None
    frames = _frames(error.__traceback__)
    mine = [i for i, (path, *_rest) in enumerate(frames) if _is_users(path)]
    if not mine:
        return None
    at = mine[-1]
    path, line, source, _name = frames[at]
    call = frames[at + 1][3] if at + 1 < len(frames) else None
    if call is not None and (not call.startswith("torch.")
                             or any(part.startswith("_") for part in call.split("."))):
        call = None  # torch's own helper (torch.cuda._lazy_init): the user's line says more
    built = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
    reason = ("no GPU is visible to the rank" if built
              else f"torch {torch.__version__} is built without CUDA")
    return {"kind": "no_gpu", "file": path, "line": line, "source": source, "call": call,
            "reason": reason, "error": f"{type(error).__name__}: {text}"[:500]}


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str, str]]:
    """(file, line, source text, module.qualname) of each frame, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        module = tb.tb_frame.f_globals.get("__name__", "")
        source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        frames.append((code.co_filename, tb.tb_lineno, source,
                       f"{module}.{getattr(code, 'co_qualname', code.co_name)}"))
        tb = tb.tb_next
    return frames


def _is_users(path: str) -> bool:
    full = os.path.abspath(path)
    return not (path.startswith("<") or full.startswith(_TORCH_DIR)
                or full.startswith(_PRISM_DIR))


def watch(emit: Callable[[dict], None]) -> None:
    """Chain an excepthook that emits the ``no_gpu`` event of an uncaught
    no-GPU error, then reports it as the hook before did."""
    previous = sys.excepthook

    def excepthook(kind, error, tb):
        try:
            event = no_gpu_event(error)
            if event is not None:
                emit(event)
        except Exception:  # a hook that fails hides the user's error: never
            pass
        previous(kind, error, tb)

    sys.excepthook = excepthook
