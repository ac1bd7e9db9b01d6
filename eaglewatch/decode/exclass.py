"""The exception class a message's wording gives away, for reports that quote ``str(e)`` and drop the class.

``'X' object has no attribute 'y'`` is an AttributeError whoever prints it; an expert reads the class from the
words. Only wordings that belong to one class are listed.
"""

from __future__ import annotations

import re
from typing import Optional

_CLASS_BY_MESSAGE = (
    (re.compile(r"object has no attribute '|^module '[^']+' has no attribute '"), "AttributeError"),
    (re.compile(r"^(?:CUDA|HIP|NCCL|cuDNN|CUBLAS) error\b|^NCCL error"), "RuntimeError"),
    (re.compile(r"^shape '\[[^\]]*\]' is invalid for input of size \d+"), "RuntimeError"),
    # c10's TORCH_CHECK with no message of its own (a c10::Error, which Python sees as a RuntimeError)
    (re.compile(r"^Expected \S.* to be true, but got false"), "RuntimeError"),
    # ctypes on Windows, for a function the DLL does not export (on Linux its message is dlerror()'s, which an
    # import or a dlopen prints too)
    (re.compile(r"^function (?:'[^'\s]+'|ordinal \d+) not found$"), "AttributeError"),
    # peft's refusal to merge adapters into a quantized or layer-replicated base model
    (re.compile(r"^Cannot merge (?:[\w-]+ ){0,2}layers when (?:the model is |base model layers are replicated)"),
     "ValueError"),
    # an older transformers refusing a rope_scaling it cannot read (Llama 3.1's llama3 form)
    (re.compile(r"^`?rope_(?:scaling|parameters)`?(?: must be a dictionary with (?:with )?two fields|'s type field "
                r"must be one of )"), "ValueError"),
    # transformers (and diffusers) on a file a model's folder or Hub repository lacks: raised as EnvironmentError
    (re.compile(r"^\S+ does not appear to have (?:a file|files) named "), "OSError"),
    (re.compile(r"^CUDA out of memory"), "torch.OutOfMemoryError"),
    (re.compile(r"^No module named '"), "ModuleNotFoundError"),
    (re.compile(r"index out of range$"), "IndexError"),
    (re.compile(r"object is not (?:subscriptable|callable|iterable)|unsupported operand type"
                r"|got an unexpected keyword argument|missing \d+ required positional argument"), "TypeError"),
)


def class_from_message(message: str) -> Optional[str]:
    """The class an expert names from the message alone, or None."""
    for pattern, name in _CLASS_BY_MESSAGE:
        if pattern.search(message):
            return name
    return None
