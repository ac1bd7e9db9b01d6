"""eaglewatch: run, watch and restart EAGLE-3 hidden-state extraction jobs.

The package has two halves: ``eaglewatch.pipeline`` (GPU host: prepare, extract, verify, agent) and
``eaglewatch.tui`` (operator terminal: decoder, connection, dashboard). The only module both import is
``eaglewatch.protocol``.
"""

__version__ = "0.1.0"
