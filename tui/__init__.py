"""Operator side: the connection to the GPU host, the run state, the host commands and the Textual dashboard.

Importing this package must stay cheap and must not need torch or vLLM.
"""
