"""The pins of images/gpu-lock.txt, read by the project's own reader (hack/gpu-lock.py, a script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "images" / "gpu-lock.txt"
READER = "hack/gpu-lock.py"


def reader() -> ModuleType:
    """hack/gpu-lock.py as a module (``read(path) -> list[Pin]``)."""
    spec = importlib.util.spec_from_file_location("gpu_lock", ROOT / READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_lock"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
