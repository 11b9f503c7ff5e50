"""`edgefl status RUN`: where a served run stands, from its run folder alone (another terminal, another
machine with the folder): the round in progress with each device's state, as `edgefl serve` last wrote
it to status.json, and the finished rounds from history.json. `edgefl --version` lives here too."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from edgefl.cli.console import STATUS_FILE, STATUS_SCHEMA, clock, device_lines, header, round_line
from edgefl.errors import ConfigError

STALE_S = 30.0    # serve rewrites the file every few seconds: older than this, it is not running


def status(
    run: Path = typer.Argument(..., help="run folder ('edgefl serve --state DIR', or 'edgefl emulate -o DIR')"),
    rounds: int = typer.Option(10, "--rounds", min=0, help="finished rounds to show (the last ones)"),
):
    """Where a run stands: the round in progress per device (sent, downloading, training, reported, failed,
    offline), and the finished rounds."""
    from edgefl.cli.console import stdout

    current, history = _read(run / STATUS_FILE), _history(run)
    if current is None and history is None:
        if (run / "plan.json").is_file():      # a run that stopped (or is) before its first round ended
            stdout.print(f"{run}: no round finished yet (its plan was written at "
                         f"{clock((run / 'plan.json').stat().st_mtime)}); history.json comes after each round, and "
                         "a run that stopped before said why on its own output", highlight=False, markup=False)
            return
        raise ConfigError(f"{run}: neither {STATUS_FILE} nor history.json is there; give the folder of "
                          "'edgefl serve --state' (or 'edgefl emulate -o')")
    now = time.time()
    if current is not None:
        for line in _progress(current, now):
            stdout.print(line, highlight=False, markup=False)
    if history:
        shown = history[-rounds:] if rounds else []
        stdout.print(f"finished rounds: {len(history)}" + (f" (the last {len(shown)})" if len(shown) < len(history)
                                                            else ""), highlight=False)
        for record in shown:
            stdout.print(f"  {round_line(record)}", highlight=False, markup=False)


def _progress(status: dict, now: float) -> list[str]:
    if status.get("finished"):
        line = (f"run {status.get('outcome') or 'finished'} at {clock(status['updated'])}, "
                f"round {status.get('round') or 0} of {status.get('rounds', '?')}")
        if str(status.get("outcome")).startswith("stopped"):
            line += "; start edgefl serve again with the same --state to resume"
        return [line]
    age = now - status.get("updated", 0)
    lines = [header(status, now) + f" (updated {age:.0f} s ago)"]
    if age > STALE_S:
        lines.append(f"edgefl serve (pid {status.get('pid')}) has not updated this for {age:.0f} s: it is not "
                     "running; start it again with the same --state to resume")
    lines += [f"  {line}" for line in device_lines(status, now)]
    if status.get("unexpected"):
        lines.append(f"  also connected but not in this fleet: {', '.join(status['unexpected'])}")
    return lines


def _read(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable as JSON ({exc}); 'edgefl serve' rewrites it while it runs") from None
    if not isinstance(data, dict) or data.get("schema") != STATUS_SCHEMA:
        raise ConfigError(f"{path}: not an edgefl status file (schema {data.get('schema') if isinstance(data, dict) else None!r}, "
                          f"expected {STATUS_SCHEMA!r}); written by another edgefl version?")
    return data


def _history(run: Path) -> Optional[list]:
    from edgefl.server.history import read_history, record_from_json

    path = run / "history.json"
    if not path.exists():
        return None
    try:
        return [record_from_json(r) for r in read_history(path)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a run history ({type(exc).__name__}: {exc})") from None


def version(
    show: bool = typer.Option(False, "--version", is_eager=True, help="print the edgefl version and exit"),
):
    """Federated learning that fits every device's memory budget."""
    if show:
        import edgefl

        print(f"edgefl {edgefl.version() or 'unknown (not installed; pip install -e .)'}")
        raise typer.Exit()
