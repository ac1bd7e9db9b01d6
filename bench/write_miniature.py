"""Write the miniature eaglewatch's preflight would run for a config, into a folder (for bare vLLM to start on).

    python bench/write_miniature.py CONFIG_DIR OUT_DIR [LAYER_IDS...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.preflight.miniature import map_layer_ids, plan_miniature, write_miniature


def main() -> None:
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    layer_ids = [int(x) for x in sys.argv[3:]] or [2, 30, 58, 61]
    info = mi.load_model_info(source, check_shards=False)
    depth, _ = map_layer_ids(layer_ids, info.num_hidden_layers)
    plan = plan_miniature(info.config, depth, platform="gpu")
    write_miniature(plan, out, info.dtype or "bfloat16")
    print(f"{out}: {plan.summary()}")


if __name__ == "__main__":
    main()
