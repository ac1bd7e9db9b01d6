"""The dashboard: a Textual app that launches, watches and restarts runs, locally or over SSH.

Data flows one way: thread workers (``feed``) read the connection and feed the pure decoder and run state
(``eaglewatch.tui.runstate``); screens poll the state's version at a fixed rate and hand widgets plain views.
Importing this package imports no Textual; ``app``, ``screens`` and ``widgets`` do.
"""
