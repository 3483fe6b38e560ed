"""NVIDIA Dynamo's own SGLang examples as a test set, and what each one does here.

``tests/fixtures/dynamo-sglang-deploy`` holds every manifest of ``examples/backends/sglang/deploy`` of
ai-dynamo/dynamo (v1alpha1 at the top, v1beta1 under ``v1beta1/``) with only the images changed to ours.
Each either serves its purpose (``chat``: the OpenAI chat and completions API; ``embeddings``;
``images``: image generation) or is refused before anything runs, with the ``Problem`` reason that
names what is unsupported (the message says why and what to do). The unit tier checks the verdicts
(render), the operator tier applies the v1beta1 ones that serve, the e2e tier serves every one that
serves with dynamo-run on the mocker. A new file in the folder must be given a line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["DYNAMO_EXAMPLES", "FIXTURES", "Verdict", "serving"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamo-sglang-deploy"


@dataclass(frozen=True)
class Verdict:
    # gateway: chat behind a Gateway API gateway (an endpoint picker), which dynamo-run and the
    # real-node tier do not have: rendered, never served by them (not in ``serving()``)
    purpose: Literal["chat", "embeddings", "images", "gateway"] | None = None
    refused: str | None = None  # the reason of every Problem it gets


CHAT, EMBEDDINGS, IMAGES = Verdict("chat"), Verdict("embeddings"), Verdict("images")
SIDECAR = Verdict(refused="EngineSidecarNotSupported")
GMS = Verdict(refused="GpuMemoryServiceNotSupported")

DYNAMO_EXAMPLES: dict[str, Verdict] = {
    "agg.yaml": CHAT,
    "agg_embed.yaml": EMBEDDINGS,
    "agg_epp.yaml": Verdict("gateway"),
    "agg_gms.yaml": GMS,
    "agg_image_diffusion.yaml": IMAGES,
    "agg_llm_diffusion.yaml": CHAT,
    "agg_logging.yaml": CHAT,
    "agg_router.yaml": CHAT,
    "disagg-multinode.yaml": CHAT,
    "disagg.yaml": CHAT,
    "disagg_planner.yaml": CHAT,
    "sidecar_smg_agg.yaml": SIDECAR,
    "sidecar_smg_disagg.yaml": SIDECAR,
    "v1beta1/agg.yaml": CHAT,
    "v1beta1/agg_gms.yaml": GMS,
    "v1beta1/agg_logging.yaml": CHAT,
    "v1beta1/agg_router.yaml": CHAT,
    "v1beta1/disagg-multinode.yaml": CHAT,
    "v1beta1/disagg.yaml": CHAT,
    "v1beta1/disagg_planner.yaml": CHAT,
    "v1beta1/openengine-agg.yaml": SIDECAR,
    "v1beta1/openengine-disagg.yaml": SIDECAR,
}


def serving(prefix: str = "") -> list[Path]:
    """The fixtures that serve, under ``prefix`` (e.g. "v1beta1/")."""
    return [
        FIXTURES / name
        for name, v in sorted(DYNAMO_EXAMPLES.items())
        if v.purpose and v.purpose != "gateway" and name.startswith(prefix)
    ]
