"""The operator side's link to a GPU host: one interface for a local agent (subprocess) and a remote one (SSH).

::

    from eaglewatch.tui.connection import Connection

    with Connection("gpu-box") as conn:          # or "local", or "user@host:2222"
        run = conn.launch(["eaglewatch", "extract", ...], name="llama")
        watch = conn.watch(run["run"])
        for batch in iter(lambda: watch.get(1.0), None): ...

The items a watch delivers (LogChunk, Event, JobState, Notice, LinkState, Telemetry) are defined in
``eaglewatch.tui.messages`` and re-exported here. See docs/protocol.md and docs/agent.md.
"""

from eaglewatch.tui.connection.connection import (
    CLOSED,
    CONNECTED,
    FAILED,
    IDLE,
    LOST,
    RECONNECTING,
    Connection,
    open_connection,
)
from eaglewatch.tui.connection.errors import (
    AgentError,
    AgentStartError,
    AuthenticationFailed,
    ConnectionFailed,
    HostKeyChangedError,
    LinkLost,
    UnknownHostKeyError,
)
from eaglewatch.tui.connection.ssh import SSHOptions, accept_host_key
from eaglewatch.tui.connection.stream import RunWatch
from eaglewatch.tui.messages import Event, JobState, LinkState, LogChunk, Notice, Telemetry

__all__ = [
    "AgentError",
    "AgentStartError",
    "AuthenticationFailed",
    "CLOSED",
    "CONNECTED",
    "Connection",
    "ConnectionFailed",
    "Event",
    "FAILED",
    "HostKeyChangedError",
    "IDLE",
    "JobState",
    "LOST",
    "LinkLost",
    "LinkState",
    "LogChunk",
    "Notice",
    "RECONNECTING",
    "RunWatch",
    "SSHOptions",
    "Telemetry",
    "UnknownHostKeyError",
    "accept_host_key",
    "open_connection",
]
