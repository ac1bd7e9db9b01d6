"""Errors meant for the operator: one clear sentence, no traceback, exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an impossible request, found before (or instead of) doing expensive work.

    The message must say what is wrong and, where it can, where (file and line) and how to fix it.
    """

    exit_code = 2
