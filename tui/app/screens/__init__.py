"""Screens of the dashboard: one run, the runs of a host, and the dialogs."""
