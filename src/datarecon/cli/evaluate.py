"""CLI commands of this area (being written; registers nothing yet)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to app."""
