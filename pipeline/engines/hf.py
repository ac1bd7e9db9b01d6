"""The transformers engine: one forward pass per batch, hidden states captured by hooks on the decoder layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from eaglewatch.pipeline.output import STORAGE_DTYPE, write_sample_file
from eaglewatch.pipeline.prepared_data import Sample


def find_decoder_layers(model: Any) -> Any:
    """The model's list of decoder layers, wherever the architecture keeps it."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for holder in (decoder, getattr(decoder, "language_model", None), getattr(model, "model", None)):
        layers = getattr(holder, "layers", None)
        if layers is not None:
            return layers
    raise RuntimeError(f"cannot find the decoder layers of {type(model).__name__}")


class HFEngine:
    name = "hf"

    def __init__(self, model_path: str | Path, layer_ids: Sequence[int], dtype: str, device: str | None = None,
                 trust_remote_code: bool = False, fsync: bool = True, storage: str = STORAGE_DTYPE):
        self.model_path = str(model_path)
        self.layer_ids = list(layer_ids)
        self.dtype = dtype
        self.device = device
        self.trust_remote_code = trust_remote_code
        self.fsync = fsync
        self.storage = storage
        self.model: Any = None
        self._captured: dict[int, Any] = {}

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=getattr(torch, self.dtype), local_files_only=True,
            trust_remote_code=self.trust_remote_code,
        ).to(self.device).eval()
        layers = find_decoder_layers(self.model)
        embed = self.model.get_input_embeddings()
        for layer_id in self.layer_ids:
            module = embed if layer_id == 0 else layers[layer_id - 1]
            module.register_forward_hook(self._hook(layer_id))

    def _hook(self, layer_id: int):
        def capture(module: Any, inputs: Any, output: Any) -> None:
            self._captured[layer_id] = output[0] if isinstance(output, (tuple, list)) else output
        return capture

    def hidden_states(self, samples: Sequence[Sample]) -> list[Any]:
        """Per sample, a CPU tensor [seq, n_layers, hidden] in the model dtype."""
        import torch

        longest = max(s.num_tokens for s in samples)
        ids = torch.zeros((len(samples), longest), dtype=torch.long)
        mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, s in enumerate(samples):
            ids[row, : s.num_tokens] = torch.tensor(s.input_ids)
            mask[row, : s.num_tokens] = 1
        self._captured.clear()
        with torch.inference_mode():
            self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False)
        stacked = torch.stack([self._captured[k] for k in self.layer_ids], dim=2)  # [batch, seq, layers, hidden]
        stacked = stacked.to("cpu")
        return [stacked[row, : s.num_tokens].contiguous() for row, s in enumerate(samples)]

    def submit(self, samples: Sequence[Sample], paths: Sequence[Path]) -> None:
        import torch

        for sample, path, states in zip(samples, paths, self.hidden_states(samples)):
            write_sample_file(path, {
                "hidden_states": states,
                "token_ids": torch.tensor(sample.input_ids, dtype=torch.int64),
                "loss_mask": torch.tensor(sample.loss_mask, dtype=torch.int8),
            }, fsync=self.fsync, storage=self.storage)

    def flush(self) -> None:
        return None  # submit writes synchronously

    def wait_written(self, paths: Sequence[Path], timeout_s: float) -> None:
        return None

    def versions(self) -> dict[str, str]:
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}

    def device_names(self) -> list[str]:
        import torch

        if self.device and self.device.startswith("cuda"):
            return [torch.cuda.get_device_name(0)]
        return []

    def close(self) -> None:
        self.model = None
