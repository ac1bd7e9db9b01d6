"""Operator side: log decoding, the connection to the GPU host, and the Textual dashboard.

Importing this package must stay cheap and must not need torch or vLLM.
"""
