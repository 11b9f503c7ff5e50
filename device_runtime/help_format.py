"""How `edgefl-device --help` reads: as `edgefl --help` does (argparse's layout, Typer's words)."""
from __future__ import annotations

import argparse


class Help(argparse.HelpFormatter):
    """Help that reads as `edgefl --help` does: 'Usage:', each option's default in brackets after its help."""

    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)

    def _get_help_string(self, action):
        text = action.help or ""
        shown = action.option_strings and action.default is not None and action.default is not False \
            and action.default is not argparse.SUPPRESS
        return f"{text}  [default: {action.default}]" if shown and "default" not in text else text
