"""GPU host side: prepare, extract, verify, tiny models, and the supervising agent.

Heavy imports (torch, transformers, vLLM) happen inside the functions that need them, so that
``import eaglewatch.pipeline`` stays cheap and works on a machine without them.
"""
