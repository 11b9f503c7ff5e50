"""--help as a new user reads it (issue 40): every option of every command says what it is for, values are named
plainly (no Python type names such as <list[Path]> or <int range>), the commands that take a model and a method
list them, and edgefl-device's help reads like edgefl's and says that 'edgefl-device --id ...' runs the agent."""
from __future__ import annotations

import argparse
import re

import pytest
from click.testing import CliRunner

from edgefl.cli.main import command
from edgefl.cli.options import METHODS, MODELS

PYTHON_TYPES = re.compile(r"<(?:list\[|int|float|str|path|bool)")


def _commands(group=None, path=()):
    group = group or command()
    for name, sub in sorted(getattr(group, "commands", {}).items()):
        if getattr(sub, "commands", None):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


COMMANDS = list(_commands())


def test_every_command_is_covered():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"plan", "emulate", "serve", "report", "status", "fleet up", "broker config", "data export"} <= names


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_says_what_it_is_for_and_names_its_value_plainly(path, cmd):
    bare = [p.opts for p in cmd.params if p.name != "help" and not (p.help or "").strip()]
    assert not bare, f"edgefl {' '.join(path)}: options without help: {bare}"
    r = CliRunner().invoke(command(), [*path, "--help"], terminal_width=120)
    assert r.exit_code == 0, r.output
    assert not PYTHON_TYPES.search(r.output), r.output


@pytest.mark.parametrize("name", ["plan", "emulate"])
def test_the_commands_that_take_a_model_and_a_method_list_them(name):
    text = " ".join(CliRunner().invoke(command(), [name, "--help"], terminal_width=120).output.split())
    assert " ".join(MODELS.split()) in text and " ".join(METHODS.split()) in text
    assert "--devices FLEET.yaml" in text and "--model MODEL" in text and "--method METHOD" in text


def test_serve_says_that_without_a_dataset_nothing_is_evaluated():
    text = " ".join(CliRunner().invoke(command(), ["serve", "--help"], terminal_width=120).output.split())
    assert "without it nothing is evaluated" in text


def _device_help(*argv: str) -> str:
    import contextlib
    import io

    from edgefl.device_runtime.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def _flat(text: str) -> str:
    """Without whitespace: argparse wraps lines at hyphens too."""
    return "".join(text.split())


def test_edgefl_device_says_that_an_id_alone_runs_the_agent():
    text = _device_help()
    assert text.startswith("Usage: edgefl-device")
    assert _flat("'edgefl-device --id ID --broker URL ...' (no command) means 'edgefl-device run --id ID --broker URL "
                 "...'") in _flat(text)
    assert _flat("Join a coordinator over MQTT and train what it sends until stopped; 'edgefl-device --id ID ...' "
                 "means the same.") in _flat(_device_help("run"))


def test_every_edgefl_device_option_has_help_and_shows_its_default():
    from edgefl.device_runtime.cli import parser

    [commands] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        bare = [a.option_strings for a in sub._actions if a.option_strings and not (a.help or "").strip()]
        assert not bare, f"edgefl-device {name}: options without help: {bare}"
    text = _device_help("train")
    assert text.startswith("Usage: edgefl-device train") and _flat("--steps N training steps [default: 20]") in _flat(text)
