"""Choose the engine that runs the workers: SGLang on GPUs, or the mocker.

``choose_engine`` is pure: it takes what ``probe_host`` found (is sglang importable, which GPUs are
visible) and returns the engine with the reason, which dynamo-run prints.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from dynamo_worker.local.plan import Engine

__all__ = ["EngineChoice", "HostFacts", "choose_engine", "probe_host"]

log = logging.getLogger(__name__)

EngineRequest = Literal["auto", "mocker", "sglang"]


@dataclass(frozen=True)
class HostFacts:
    sglang_importable: bool
    gpus: tuple[str, ...]  # the GPU ids processes may be given through CUDA_VISIBLE_DEVICES
    gpu_source: str  # where the ids came from, for messages


@dataclass(frozen=True)
class EngineChoice:
    engine: Engine
    reason: str


def visible_gpus(
    cuda_visible_devices: str | None, nvidia_smi_count: int | None
) -> tuple[tuple[str, ...], str]:
    """GPU ids from CUDA_VISIBLE_DEVICES when set (``""`` hides all), else from ``nvidia-smi -L``."""
    if cuda_visible_devices is not None:
        ids = tuple(g.strip() for g in cuda_visible_devices.split(",") if g.strip() and g.strip() != "-1")
        return ids, f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}"
    if nvidia_smi_count:
        return tuple(str(i) for i in range(nvidia_smi_count)), "nvidia-smi -L"
    return (), "no CUDA_VISIBLE_DEVICES and no nvidia-smi"


def _nvidia_smi_count(timeout: float = 10.0) -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("Could not run nvidia-smi error=%s", e)
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def probe_host(cuda_visible_devices: str | None) -> HostFacts:
    """Look at this machine: whether ``import sglang`` can work (found, not imported), and its GPUs."""
    importable = importlib.util.find_spec("sglang") is not None
    smi = None if cuda_visible_devices is not None else _nvidia_smi_count()
    gpus, source = visible_gpus(cuda_visible_devices, smi)
    return HostFacts(sglang_importable=importable, gpus=gpus, gpu_source=source)


def choose_engine(requested: EngineRequest, facts: HostFacts) -> EngineChoice:
    n = len(facts.gpus)
    if requested == "mocker":
        return EngineChoice("mocker", "--engine mocker was asked for")
    if requested == "sglang":
        return EngineChoice("sglang", f"--engine sglang was asked for ({n} GPUs from {facts.gpu_source})")
    if not facts.sglang_importable:
        return EngineChoice(
            "mocker", "sglang is not installed (pip install 'dynamo-sglang[sglang]' to serve real models)"
        )
    if n == 0:
        return EngineChoice("mocker", f"sglang is installed but no GPU is visible ({facts.gpu_source})")
    return EngineChoice("sglang", f"sglang is installed and {n} GPUs are visible ({facts.gpu_source})")
