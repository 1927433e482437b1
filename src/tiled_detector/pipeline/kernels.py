"""Whether the frame program's Triton kernels run here, decided once per process.

The fused stages (`fused_preprocess`, `fused_decode`, `fused_postprocess`) are Triton kernels beside the torch
stages they stand for; the torch stages stay the reference and the fallback. They run on a CUDA device where
`triton` imports (torch's own on x86-64 CUDA wheels; Jetson's torch usually ships without it), unless the
environment variable `TILED_DETECTOR_KERNELS=torch` asks for the torch stages everywhere. A CUDA device without
triton logs one INFO line and runs the torch stages. `TILED_DETECTOR_KERNELS=always` with `TRITON_INTERPRET=1`
(Triton's interpreter, set before triton is first imported) runs the same kernels on CPU tensors: the tests'
equality check where no GPU is lent (the CPU's own path is never the interpreter's otherwise).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from tiled_detector.runtime.errors import one_line

LOG = logging.getLogger(__name__)
T = TypeVar("T")
# "torch": the torch stages everywhere (the reference, for checks); "always": also on the CPU, interpreted (tests)
ENVIRONMENT = "TILED_DETECTOR_KERNELS"


@functools.cache
def triton() -> tuple[Any, Any] | None:
    """(triton, triton.language) when triton imports, else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton as module
        from triton import language
    except Exception:  # a broken install (no driver library, an old compiler) runs the torch stages
        return None
    return module, language


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1: on the host, on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _said(device_type: str) -> None:
    """The one INFO line of a CUDA device without triton."""
    LOG.info(
        "triton is not available on this %s platform: the frame program runs its torch kernels (more launches a "
        "frame, the same results)",
        device_type,
    )


def enabled(device: torch.device) -> bool:
    """Whether the fused kernels run for tensors on `device`: CUDA with triton importable, unless
    `TILED_DETECTOR_KERNELS=torch`; any device with `TILED_DETECTOR_KERNELS=always` under the interpreter."""
    choice = os.environ.get(ENVIRONMENT, "").lower()
    if choice == "torch":
        return False
    if device.type != "cuda" and not (choice == "always" and interpreted()):
        return False
    if triton() is None:
        _said(device.type)
        return False
    return True


def launch_options() -> dict[str, Any]:
    """Launch keywords every kernel takes: no multiply-add contraction (each float operation rounded as torch's
    separate kernels round it, so comparisons against thresholds decide alike); none under the interpreter."""
    return {} if interpreted() else {"enable_fp_fusion": False}


def guarded(kernel: Callable[..., T | None], reference: Callable[..., T], what: str) -> Callable[..., T]:
    """`kernel` with its torch stage `reference` behind it: the reference runs where the kernel returns None (a
    case it does not cover), and from then on where the kernel raises and the reference does not (a platform whose
    triton cannot compile it), with one WARNING line; an error the reference raises too (bad input) is raised as
    it is."""
    working = True

    def call(*args: Any, **kwargs: Any) -> T:
        nonlocal working
        if working:
            try:
                found = kernel(*args, **kwargs)
            except Exception as error:
                result = reference(
                    *args, **kwargs
                )  # raises here when the input, not the kernel, was the problem
                LOG.warning(
                    "the %s kernels failed (%s): its torch stage runs from now on", what, one_line(error)
                )
                working = False
                return result
            if found is not None:
                return found
        return reference(*args, **kwargs)

    return call
