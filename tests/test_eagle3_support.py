"""The static EAGLE-3 support check against the truth: the installed vLLM's own ``supports_eagle3`` on every
registered architecture, Python's own ``isinstance`` on a synthetic vLLM tree, and the published target configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglewatch.pipeline.preflight.eagle3_support import (
    Eagle3Checker,
    Eagle3Support,
    eagle3_support,
    registered_architectures,
)
from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM, find_vllm

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TARGET_CONFIGS = FIXTURES / "target-configs"

# What vLLM 0.32.0 itself answers (``supports_eagle3`` on the registered class, found by running it, see
# ``real_answers`` below), for the published target configs and the usual EAGLE-3 targets. The comparison test
# re-checks this table against the installed vLLM, so a vLLM upgrade that changes an answer fails loudly there.
PINNED_VLLM = "0.32.0"
PUBLISHED_TARGETS = {
    "deepseek_v2_lite.json": ("DeepseekV2ForCausalLM", "supported"),
    "gemma_3_1b.json": ("Gemma3ForCausalLM", "unsupported"),
    "glm_4_5_air.json": ("Glm4MoeForCausalLM", "unsupported"),
    "gpt_oss_20b.json": ("GptOssForCausalLM", "supported"),
}
KNOWN_ANSWERS = {
    "LlamaForCausalLM": "supported",
    "Llama4ForCausalLM": "supported",
    "Qwen2ForCausalLM": "supported",
    "Qwen3ForCausalLM": "supported",
    "Qwen3MoeForCausalLM": "supported",
    "Qwen3NextForCausalLM": "supported",
    "DeepseekV2ForCausalLM": "supported",
    "DeepseekV3ForCausalLM": "supported",
    "KimiK25ForConditionalGeneration": "supported",
    "MiniMaxM2ForCausalLM": "supported",
    "MistralForCausalLM": "supported",
    "Phi3ForCausalLM": "supported",
    "GptOssForCausalLM": "supported",
    "Glm4MoeForCausalLM": "unsupported",
    "Gemma2ForCausalLM": "unsupported",
    "Gemma3ForCausalLM": "unsupported",
    "MixtralForCausalLM": "unsupported",
    "Qwen2MoeForCausalLM": "unsupported",
}

# Runs in a child process: vLLM resolves each registered architecture to its class the way ModelRegistry's
# ``load_model_cls`` does (import the module, take the attribute) and asks ``supports_eagle3``. Classes whose module
# needs what a CPU test machine lacks (torchvision, CUDA kernels) are reported as skipped with the error.
_REAL_PROBE = """
import importlib, json, logging, warnings
warnings.simplefilter("ignore")
from vllm.model_executor.models.registry import ModelRegistry
from vllm.model_executor.models.interfaces import supports_eagle3
logging.disable(logging.CRITICAL)
answers, skipped = {}, {}
for arch, model in sorted(ModelRegistry.models.items()):
    try:
        cls = getattr(importlib.import_module(model.module_name), model.class_name)
    except BaseException as exc:
        skipped[arch] = f"{type(exc).__name__}: {exc}"[:300]
        continue
    answers[arch] = "supported" if supports_eagle3(cls) else "unsupported"
print("EAGLE3-PROBE " + json.dumps({"answers": answers, "skipped": skipped}))
"""


def _installed() -> InstalledVLLM:
    vllm = find_vllm()
    if vllm is None:
        pytest.skip("vLLM is not installed")
    return vllm


def _pinned() -> InstalledVLLM:
    """The installed vLLM, when it is the version the answer tables were taken from."""
    vllm = _installed()
    if vllm.version.split("+")[0] != PINNED_VLLM:
        pytest.skip(f"the answer tables are vLLM {PINNED_VLLM}'s; installed is {vllm.version}")
    return vllm


def _probe_output(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("EAGLE3-PROBE "):
            return json.loads(line.removeprefix("EAGLE3-PROBE "))
    raise AssertionError(f"the probe printed no answer (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="module")
def real_answers() -> dict:
    pytest.importorskip("vllm")
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", _REAL_PROBE], capture_output=True, text=True, timeout=540, env=env)
    return _probe_output(proc)


# ---------------------------------------------------------------------------------------------------------------
# The real vLLM, every architecture.


@pytest.mark.vllm
def test_static_check_agrees_with_vllm_on_every_registered_architecture(real_answers):
    vllm = _installed()
    answers, skipped = real_answers["answers"], real_answers["skipped"]
    architectures = registered_architectures(vllm)
    # The registry parse itself: exactly the names vLLM's ModelRegistry holds.
    assert set(architectures) == set(answers) | set(skipped)
    assert len(skipped) < len(architectures) / 2, f"most classes could not be imported here: {skipped}"

    checker = Eagle3Checker(vllm)  # one checker: each vLLM file is parsed once for the whole registry
    static = {arch: checker.check(arch) for arch in architectures}
    unknown = sorted(arch for arch, got in static.items() if got.status == "unknown")
    assert len(unknown) <= len(architectures) * 0.03, [static[a].reason for a in unknown]
    assert all(static[a].status != "unregistered" for a in architectures)

    disagreements = [f"{arch}: vLLM says {real}, static says {static[arch].status} ({static[arch].reason})"
                     for arch, real in answers.items() if static[arch].status not in ("unknown", real)]
    assert not disagreements, "\n".join(disagreements)
    # Both answers occur: a check that said "supported" to everything would pass the line above on a lucky vLLM.
    assert {"supported", "unsupported"} <= {static[a].status for a in answers}


@pytest.mark.vllm
def test_answer_tables_are_what_the_installed_vllm_says(real_answers):
    _pinned()
    answers = real_answers["answers"]
    expected = {**KNOWN_ANSWERS, **dict(PUBLISHED_TARGETS.values())}
    assert {arch: answers.get(arch, "skipped") for arch in expected} == expected


# ---------------------------------------------------------------------------------------------------------------
# Published configs and the usual targets, static only (no vLLM import).


@pytest.mark.parametrize("name", sorted(PUBLISHED_TARGETS))
def test_published_target_configs(name):
    vllm = _pinned()
    config = json.loads((TARGET_CONFIGS / name).read_text(encoding="utf-8"))
    architecture, status = PUBLISHED_TARGETS[name]
    assert config["architectures"][0] == architecture
    got = eagle3_support(vllm, architecture)
    assert (got.architecture, got.status, got.model_class) == (architecture, status, architecture)
    if status == "supported":
        assert got.reason == f"{architecture} implements SupportsEagle3 in vLLM {vllm.version}"
    else:
        assert got.reason == (f"{architecture} (vllm/model_executor/models/{got.module}.py) does not implement "
                              f"SupportsEagle3 in vLLM {vllm.version}: this vLLM cannot capture its hidden states")


@pytest.mark.parametrize("architecture", sorted(KNOWN_ANSWERS))
def test_usual_eagle3_targets(architecture):
    assert eagle3_support(_pinned(), architecture).status == KNOWN_ANSWERS[architecture]


def test_kimi_k25_config_both_levels_supported():
    vllm = _pinned()
    config = json.loads((FIXTURES / "configs" / "kimi_k25_config.json").read_text(encoding="utf-8"))
    outer = eagle3_support(vllm, config["architectures"][0])
    inner = eagle3_support(vllm, config["text_config"]["architectures"][0])
    assert (outer.status, outer.module) == ("supported", "kimi_k25")
    assert (inner.status, inner.module, inner.model_class) == ("supported", "deepseek_v2", "DeepseekV3ForCausalLM")


def test_architecture_registered_under_another_class_name():
    got = eagle3_support(_pinned(), "Cohere2ForCausalLM")
    assert (got.model_class, got.module, got.status) == ("CohereForCausalLM", "commandr", "unsupported")
    assert got.reason.startswith("CohereForCausalLM (vllm/model_executor/models/commandr.py) does not implement")


def test_unregistered_and_removed_architectures():
    vllm = _installed()
    missing = eagle3_support(vllm, "NoSuchModelForCausalLM")
    assert missing == Eagle3Support("NoSuchModelForCausalLM", "unregistered", None, None,
                                    f"NoSuchModelForCausalLM is not in vLLM {vllm.version}'s model registry")
    if vllm.version.split("+")[0] == PINNED_VLLM:
        removed = eagle3_support(vllm, "MPTForCausalLM")
        assert removed.status == "unregistered"
        assert removed.reason.endswith("(last supported in vLLM 0.28.0)")


def test_module_imports_neither_vllm_nor_torch():
    code = ("import sys; import eaglewatch.pipeline.preflight.eagle3_support; "
            "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------------
# A synthetic vLLM tree: every pattern the resolver follows, checked against Python's own isinstance.

_FAKE_FILES = {
    "__init__.py": "",
    "models/__init__.py": "",
    "models/pkg/__init__.py": "from .impl import PkgForCausalLM\n",
    "models/pkg/impl.py": """
        from vllm.model_executor.models import interfaces

        class PkgForCausalLM(interfaces.SupportsEagle3):
            pass
    """,
    "model_executor/__init__.py": "",
    "model_executor/models/__init__.py": "",
    "model_executor/models/interfaces.py": """
        from typing import ClassVar, Literal, Protocol, runtime_checkable

        @runtime_checkable
        class SupportsEagleBase(Protocol):
            has_own_lm_head: bool = False
            has_own_embed_tokens: bool = False

        @runtime_checkable
        class SupportsEagle3(SupportsEagleBase, Protocol):
            supports_eagle3: ClassVar[Literal[True]] = True

            def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None: ...

            def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]: ...

        class SupportsPP:
            supports_pp = True
    """,
    "model_executor/models/registry.py": """
        _TEXT_GENERATION_MODELS = {
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
            "MistralForCausalLM": ("mistral", "MistralForCausalLM"),
            "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
            "Gemma2ForCausalLM": ("gemma", "Gemma2ForCausalLM"),
            "DuckForCausalLM": ("shapes", "DuckForCausalLM"),
            "HalfDuckForCausalLM": ("shapes", "HalfDuckForCausalLM"),
            "TypedForCausalLM": ("shapes", "TypedForCausalLM"),
            "GenericForCausalLM": ("shapes", "GenericForCausalLM"),
            "WrappedForCausalLM": ("shapes", "WrappedForCausalLM"),
            "PlatformForCausalLM": ("platform", "PlatformForCausalLM"),
            "SamePlatformForCausalLM": ("platform", "SamePlatformForCausalLM"),
            "MissingForCausalLM": ("shapes", "NotThereForCausalLM"),
            "NoFileForCausalLM": ("nofile", "NoFileForCausalLM"),
            "CycleForCausalLM": ("cycle", "CycleForCausalLM"),
        }
        _SPECULATIVE_DECODING_MODELS = {
            "PkgForCausalLM": ("vllm.models.pkg", "PkgForCausalLM"),
            # Registered twice: the later dict wins, as dict unpacking does.
            "GemmaForCausalLM": ("llama", "LlamaForCausalLM"),
        }
        _VLLM_MODELS = {
            **_TEXT_GENERATION_MODELS,
            **_SPECULATIVE_DECODING_MODELS,
        }
        _PREVIOUSLY_SUPPORTED_MODELS = {"OldForCausalLM": "0.10.2"}
    """,
    "model_executor/models/llama.py": """
        from abc import ABC

        from .interfaces import SupportsEagle3, SupportsPP

        class LlamaForCausalLM(ABC, SupportsPP, SupportsEagle3):
            pass
    """,
    "model_executor/models/mistral.py": """
        from .llama import LlamaForCausalLM as _Base

        class MistralForCausalLM(_Base):
            pass
    """,
    "model_executor/models/gemma.py": """
        from vllm.model_executor.models.interfaces import SupportsPP

        class GemmaForCausalLM(SupportsPP):
            supports_eagle3 = True  # one member is not the protocol

        Gemma2ForCausalLM = GemmaForCausalLM
    """,
    "model_executor/models/shapes.py": """
        from typing import TYPE_CHECKING, Generic, TypeVar

        from . import gemma
        from .interfaces import SupportsEagle3, SupportsPP

        T = TypeVar("T")

        class DuckForCausalLM(SupportsPP):
            # Every protocol member without inheriting it: runtime_checkable says yes, so must we.
            supports_eagle3 = True
            has_own_lm_head = False
            has_own_embed_tokens = False

            def set_aux_hidden_state_layers(self, layers): ...

            def get_eagle3_default_aux_hidden_state_layers(self): ...

        class HalfDuckForCausalLM(gemma.GemmaForCausalLM):
            has_own_lm_head = False
            has_own_embed_tokens: bool  # annotated only: no attribute

        if TYPE_CHECKING:
            class _TypedBase:
                pass
        else:
            from .mistral import MistralForCausalLM as _TypedBase

        class TypedForCausalLM(_TypedBase):
            pass

        class _GenericBase(SupportsEagle3, Generic[T]):
            pass

        class GenericForCausalLM(_GenericBase[int]):
            pass

        def _wrap(cls):
            return type(cls.__name__, (cls,), {})

        WrappedForCausalLM = _wrap(gemma.GemmaForCausalLM)
    """,
    "model_executor/models/platform.py": """
        import os

        if os.environ.get("FAKE_CUDA"):
            from .llama import LlamaForCausalLM as PlatformForCausalLM
            from .llama import LlamaForCausalLM as SamePlatformForCausalLM
        else:
            from .gemma import GemmaForCausalLM as PlatformForCausalLM
            from .mistral import MistralForCausalLM as SamePlatformForCausalLM
    """,
    "model_executor/models/cycle.py": """
        from .cycle_b import Other as CycleForCausalLM
    """,
    "model_executor/models/cycle_b.py": """
        from .cycle import CycleForCausalLM as Other
    """,
}

_FAKE_EXPECTED = {
    "LlamaForCausalLM": "supported",
    "MistralForCausalLM": "supported",
    "GemmaForCausalLM": "supported",  # the later registry dict maps it to llama's class
    "Gemma2ForCausalLM": "unsupported",
    "DuckForCausalLM": "supported",
    "HalfDuckForCausalLM": "unsupported",
    "TypedForCausalLM": "supported",
    "GenericForCausalLM": "supported",
    "WrappedForCausalLM": "unknown",
    "PlatformForCausalLM": "unknown",
    "SamePlatformForCausalLM": "supported",
    "MissingForCausalLM": "unknown",
    "NoFileForCausalLM": "unknown",
    "CycleForCausalLM": "unknown",
    "PkgForCausalLM": "supported",
}

_FAKE_PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
from vllm.model_executor.models.registry import _VLLM_MODELS
from vllm.model_executor.models.interfaces import SupportsEagle3
answers = {}
for arch, (module, name) in _VLLM_MODELS.items():
    dotted = module if module.startswith("vllm.") else "vllm.model_executor.models." + module
    try:
        cls = getattr(importlib.import_module(dotted), name)
    except Exception:
        continue
    answers[arch] = "supported" if isinstance(cls, SupportsEagle3) else "unsupported"
print("EAGLE3-PROBE " + json.dumps({"answers": answers}))
"""


@pytest.fixture
def fake_vllm(tmp_path) -> InstalledVLLM:
    root = tmp_path / "vllm"
    for relative, text in _FAKE_FILES.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return InstalledVLLM(version="9.9.9", distribution="vllm", root=root)


def test_synthetic_tree_static_answers(fake_vllm):
    checker = Eagle3Checker(fake_vllm)
    got = {arch: checker.check(arch).status for arch in _FAKE_EXPECTED}
    assert got == _FAKE_EXPECTED
    assert set(registered_architectures(fake_vllm)) == set(_FAKE_EXPECTED)
    assert "different class on different platform branches" in checker.check("PlatformForCausalLM").reason
    assert "computed at import time" in checker.check("WrappedForCausalLM").reason
    old = checker.check("OldForCausalLM")
    assert (old.status, old.reason) == ("unregistered",
                                        "OldForCausalLM is not in vLLM 9.9.9's model registry "
                                        "(last supported in vLLM 0.10.2)")
    pkg = checker.check("PkgForCausalLM")
    assert (pkg.module, pkg.model_class) == ("vllm.models.pkg", "PkgForCausalLM")


@pytest.mark.parametrize("fake_cuda", ["", "1"])
def test_synthetic_tree_agrees_with_isinstance(fake_vllm, fake_cuda):
    """Python imports the synthetic tree and asks the protocol itself; the static answer must match wherever it
    is not "unknown", on both sides of the platform branch."""
    env = {**os.environ, "FAKE_CUDA": fake_cuda}
    proc = subprocess.run([sys.executable, "-c", _FAKE_PROBE, str(fake_vllm.root.parent)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=fake_vllm.root.parent)
    answers = _probe_output(proc)["answers"]
    assert set(answers) == set(_FAKE_EXPECTED) - {"MissingForCausalLM", "NoFileForCausalLM", "CycleForCausalLM"}
    checker = Eagle3Checker(fake_vllm)
    for arch, real in answers.items():
        assert checker.check(arch).status in ("unknown", real), arch


def test_unreadable_registry_is_unknown(fake_vllm):
    (fake_vllm.root / "model_executor/models/registry.py").write_text("this is not python(", encoding="utf-8")
    got = eagle3_support(fake_vllm, "LlamaForCausalLM")
    assert got.status == "unknown" and "model registry" in got.reason


def test_missing_protocol_is_unknown(fake_vllm):
    (fake_vllm.root / "model_executor/models/interfaces.py").write_text("class SupportsPP:\n    pass\n",
                                                                        encoding="utf-8")
    got = eagle3_support(fake_vllm, "LlamaForCausalLM")
    assert got.status == "unknown" and "SupportsEagle3" in got.reason
