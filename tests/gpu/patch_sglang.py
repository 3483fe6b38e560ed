"""Make SGLang 0.5.17 (pinned to transformers 5.12.1) load Qwen-VL models under the GPU image's
transformers 5.17, which renamed ``Qwen2_5_VisionRotaryEmbedding`` (to ``Qwen2_5_VLVisionRotaryEmbedding``,
with another constructor). ``sglang/srt/models/qwen2_5_vl.py`` imports the old name at module level,
and SGLang's Qwen-VL processor imports that module, so without this every Qwen2-VL / Qwen2.5-VL model
fails with "no processor registered". The fallback is transformers 5.12's own class. Idempotent; a
no-op where the old name still imports.

usage (install.sh step 1): python3 tests/gpu/patch_sglang.py /tmp/site
"""

from __future__ import annotations

import sys
from pathlib import Path

OLD = """from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionPatchEmbed,
    Qwen2_5_VisionRotaryEmbedding,
)
"""
NEW = """from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

try:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionRotaryEmbedding,
    )
except ImportError:  # transformers >= 5.13 renamed it; this is its 5.12 implementation

    class Qwen2_5_VisionRotaryEmbedding(nn.Module):
        def __init__(self, dim: int, theta: float = 10000.0) -> None:
            super().__init__()
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, seqlen: int) -> torch.Tensor:
            seq = torch.arange(seqlen, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
            return torch.outer(seq, self.inv_freq)

"""


def main(site: Path) -> int:
    path = site / "sglang" / "srt" / "models" / "qwen2_5_vl.py"
    text = path.read_text()
    if NEW in text:
        print(f"already patched: {path}")
    elif OLD in text:
        path.write_text(text.replace(OLD, NEW))
        print(f"patched: {path}")
    else:
        print(f"unexpected imports in {path}; not patched", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
