"""Textual widgets of the dashboard."""
