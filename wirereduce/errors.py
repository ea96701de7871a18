"""Errors every command-line front end shares (the ``wirereduce`` CLI and the commands that
``boards/`` and :mod:`wirereduce.schedule_cli` add to it)."""

__all__ = ["CliError"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""
