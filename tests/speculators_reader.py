"""Read an exported folder with speculators' own dataset and data loader, and save what they give.

Run as ``python speculators_reader.py DATA_PATH RESULT.pt HIDDEN_SIZE NUM_AUX TOTAL_SEQ_LEN [BACKEND]`` with
speculators on the path (``./run setup`` installs it in ``.work/speculators-site``, apart from the suite's own
environment, because its requirements would replace the CPU torch). ``BACKEND`` is ``speculators train
--hidden-states-backend`` (default ``file``; ``fp8`` dequantizes FP8 files as the trainer does), built the way
the trainer builds it. Saves ``{"rows": [...], "batches": [...]}``: per row what ``ArrowDataset`` returns, per batch
the collated tensors the trainer would get.

The suite imports this module too, without speculators: ``read_with_speculators`` runs it in a subprocess with
``SPECULATORS_ENV`` (speculators' imports are inside ``main``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

SPECULATORS_SITE = Path(__file__).resolve().parent.parent / ".work" / "speculators-site"
# speculators and the datasets package (what --format speculators and export write with), apart from the suite's
# own environment.
SPECULATORS_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(SPECULATORS_SITE), os.environ.get("PYTHONPATH")]))}


def read_with_speculators(folder: Path, tmp_path: Path, hidden: int, aux: int, seq: int,
                          backend: str = "file") -> dict[str, Any]:
    """What speculators' own dataset and loaders give for ``folder`` (see ``main``), read in a subprocess."""
    assert (SPECULATORS_SITE / "speculators").is_dir(), "speculators is not installed: run ./run setup"
    result = tmp_path / f"read-{backend}.pt"
    env = {**os.environ, **SPECULATORS_ENV}
    proc = subprocess.run([sys.executable, __file__, str(folder), str(result), str(hidden), str(aux), str(seq),
                           backend], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(result, weights_only=False)


def main(data_path: str, result: str, hidden_size: int, num_aux: int, total_seq_len: int,
         backend: str = "file") -> None:
    from hs_connectors import HiddenStatesBackend
    from speculators.train.data import ArrowDataset
    from speculators.train.dataloader import create_train_val_loaders

    # What `speculators train` does with --hidden-states-backend (speculators/train/cli.py).
    transfer = HiddenStatesBackend.registry[backend].from_train_args(
        argparse.Namespace(hidden_states_path=None), data_path)
    # on_missing="raise": a row without its file must fail here, not be generated or skipped.
    dataset = ArrowDataset(max_len=total_seq_len, datapath=data_path, on_missing="raise",
                           hidden_states_dtype=torch.float32, transfer=transfer)
    rows = []
    for index in range(len(dataset)):
        item = dataset[index]
        rows.append({"sample_id": dataset.data[index]["sample_id"], "input_ids": item["input_ids"],
                     "hidden_states": item["hidden_states"], "verifier_last_hidden_states":
                     item["verifier_last_hidden_states"], "loss_mask": item["loss_mask"],
                     "seq_len": int(dataset.data.with_format(None)[index]["seq_len"])})
    train, val = create_train_val_loaders(
        data_path=data_path, total_seq_len=total_seq_len, hidden_states_dtype=torch.float32, transfer=transfer,
        vllm_endpoint="",
        on_missing="raise", verifier_name_or_path="unused", request_timeout=None, max_retries=0,
        generation_validation_retries=0, max_consecutive_generation_failures=1, hidden_size=hidden_size,
        num_target_layers=num_aux, num_workers=0, prefetch_factor=1, preprocess=None, train_data_ratio=0.75)
    batches = []
    for loader in (train, val):
        for batch in loader:
            batches.append({k: batch[k] for k in ("input_ids", "hidden_states", "verifier_last_hidden_states",
                                                  "loss_mask", "document_ids", "error_records")})
    torch.save({"rows": rows, "batches": batches}, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
