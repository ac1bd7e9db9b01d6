"""Subcommands that talk to a GPU host through eaglewatch.tui.connection: launch, runs, attach, stop, restart."""
