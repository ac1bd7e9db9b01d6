"""The supervising agent that runs on the GPU host.

It launches pipeline jobs detached from any SSH session, records each run in a run directory, streams the run's
log and events as JSON lines (``eaglewatch.protocol``) on its stdout, and stops or restarts jobs on request.

Stdlib only (psutil is used when importable): the operator side uploads this package as a zipapp, so the host needs
no install. See docs/agent.md.
"""
