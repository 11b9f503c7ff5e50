"""A whole fleet of real device agents on this machine, for demos and tests: what `edgefl fleet up` runs.

One `edgefl-device run` process per device of the fleet file, each with its own share of a data set (split
exactly as an emulated run splits it: the same partition of the same seeded subset, shares in sorted device
order, so a served run and its emulation train the same examples), its group's runtime and memory budget, its
own artifact cache and log. With `enforce_memory` each device's training process is capped at its group's
memory budget (a cgroup where this machine permits one, else RLIMIT_AS). It runs until stopped, then stops
every device; when every agent has exited by itself (a wrong login, an unreachable broker) it says which,
what the first said last and where the logs are.

One `fleet up` per work folder: a second one started on it is refused while the first runs (it would overwrite its
logs and share files under running agents); the lock is the first's and goes with its process. A second fleet of
the same devices from another work folder is refused device by device: an agent will not run as an id another
agent on this machine runs as at that broker (edgefl.device_runtime.run_cmd), so every agent of the second exits
saying which process has its id, and this process fails naming them.

Logins: `credentials` is the deployment folder `edgefl broker config -o DIR` wrote, or its `credentials/`
folder (whichever holds `<device>.json`); with mqtts:// and no CA file, that deployment's `tls/ca.crt` is the
CA. Every agent gets its own login file and the CA.

Which agent each device runs: the one its group's plan counted (`agent:` in the fleet file; by default native
for ExecuTorch groups, python for ort and torch: edgefl.fleet.default_agent), unless `agent` overrides it for
every group, which `start` says in one line per group whose plan counted the other agent's memory. The native
agent (`edgefl-device` in C++, built by `edgefl-device build-native`; $EDGEFL_DEVICE_NATIVE names another
binary, such as a bundle's bin/edgefl-device) trains ExecuTorch sets only, so `--agent native` still runs the
Python agent for an ort or torch group. The native agent reads no profile YAML: its group's memory budget and
the profile's active power come as --memory and --power.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from edgefl.errors import ConfigError, EdgeflError
from edgefl.units import listing, parse_bytes

STOP_GRACE_S = 30.0    # after SIGTERM, for every agent together: a clean goodbye (presence, DISCONNECT)


@dataclass
class Agents:
    """The fleet file, the broker and the devices' logins, the data set and its split, and where the devices'
    data shares, caches and logs go (`workdir`)."""
    devices: Path
    broker: str
    dataset: str
    partition: str = "iid"
    seed: int = 0
    train_limit: Optional[int] = None
    data_root: Optional[Path] = None
    workdir: Path = Path("runs/fleet")
    credentials: Optional[Path] = None
    ca_file: Optional[Path] = None
    enforce_memory: bool = False
    cache_budget: Optional[str] = None     # each agent's --cache-budget (its default when None)
    agent: Optional[str] = None             # python | native for every group; None: as each group's entry says


AGENTS = ("python", "native")


def native_agent() -> Path:
    """The built native agent, or MissingDependencyError with the command that builds it."""
    from edgefl.device_runtime.native import find_agent
    from edgefl.errors import MissingDependencyError

    found = find_agent()
    if found is None:
        raise MissingDependencyError("--agent native: the native agent is not built; build it with 'edgefl-device "
                                     "build-native' (needs cmake, g++, libpaho-mqtt-dev, libssl-dev, nlohmann-json3-dev, libeigen3-dev)")
    return found


def export_shares(fleet, dataset: str, partition: str, seed: int, folder: Path, train_limit: Optional[int] = None,
                  data_root: Optional[Path] = None) -> dict[str, Path]:
    """Each device's share of the training split as DIR/<device>/{x,y}.npy, split as emulation splits it
    (edgefl.data.shares: cut to its group's `examples:`)."""
    from edgefl.data import load_split
    from edgefl.data.shares import device_shares, save_share

    train = load_split(dataset, "train", data_root, train_limit, seed)
    return {device: save_share(folder / device, train.x[idx], train.y[idx])
            for device, idx in sorted(device_shares(fleet, train, partition, seed, source=dataset).items())}


def device_command(device: str, group, broker: str, data: Path, workdir: Path, credentials: Optional[Path],
                   ca_file: Optional[Path], enforce_memory: bool, cache_budget: Optional[str] = None,
                   native: Optional[Path] = None) -> list[str]:
    """`native`: the native agent's binary, for a device of an ExecuTorch group (else the Python agent runs)."""
    native = native if group.runtime == "executorch" else None
    program = [str(native)] if native is not None else [sys.executable, "-m", "edgefl.device_runtime.cli"]
    cmd = [*program, "run", "--id", device, "--broker", broker,
           "--data", str(data), "--runtime", group.runtime, "--cache", str(workdir / "cache" / device),
           "--memory", str(group.memory_budget_bytes)]
    if native is not None and group.profile is not None:   # no YAML on the device: the profile's power as a flag
        cmd += ["--profile", group.profile.name, "--power", f"{group.profile.power_active_w}W"]
    elif group.profile is not None:
        cmd += ["--profile", group.profile.name]
    else:
        cmd += ["--power", "3W"]     # no profile: the energy estimate's stand-in power, reported as estimated
    if credentials is not None:
        cmd += ["--credentials", str(credentials / f"{device}.json")]
    if ca_file is not None:
        cmd += ["--ca-file", str(ca_file)]
    if enforce_memory:
        cmd += ["--enforce-memory"]
    if cache_budget is not None:
        cmd += ["--cache-budget", cache_budget]
    return cmd


LOCK = ".fleet-up.lock"     # in the work folder: held by the `fleet up` that runs there, holding its pid


def claim(workdir: Path):
    """The work folder, held until the returned file is closed (a context manager) or this process ends;
    ConfigError naming the `fleet up` that holds it."""
    from edgefl.outdir import exclusive

    return exclusive(workdir / LOCK, lambda pid: f"--workdir {workdir}: another 'edgefl fleet up' (pid {pid}) runs its "
                     "agents from it; stop that one (Ctrl-C), or give this one another --workdir")


def start(spec: Agents, say: Callable[[str], None]) -> dict[str, subprocess.Popen]:
    """Every device's agent started, with its data share exported and its log opened: device -> process. Start
    them holding the work folder's `claim`."""
    from edgefl.fleet import load_fleet
    from edgefl.protocol.broker_address import check_ca_file, parse_broker_url

    fleet = load_fleet(spec.devices)
    ids = [d for g in fleet.groups for d in g.device_ids]
    address = parse_broker_url(spec.broker)
    credentials, ca_file = spec.credentials, spec.ca_file
    if credentials is not None:
        credentials, found_ca = logins_folder(credentials, ids)
        if ca_file is None and address.tls and found_ca is not None:
            ca_file = found_ca
            say(f"CA certificate: {ca_file} (from the deployment folder)")
    check_ca_file(ca_file, address)
    if spec.agent is not None and spec.agent not in AGENTS:
        raise ConfigError(f"--agent {spec.agent}: choose one of: {', '.join(AGENTS)}")
    kinds = agent_kinds(fleet, spec.agent, say)
    native = native_agent() if "native" in kinds.values() else None
    if spec.cache_budget is not None:
        try:
            parse_bytes(spec.cache_budget)
        except ValueError as exc:
            raise ConfigError(f"--cache-budget {spec.cache_budget!r}: {exc} (e.g. 64MiB)") from None
    data = export_shares(fleet, spec.dataset, spec.partition, spec.seed, spec.workdir / "data", spec.train_limit,
                         spec.data_root)
    (spec.workdir / "logs").mkdir(parents=True, exist_ok=True)
    procs = {}
    for g in fleet.groups:
        for device in g.device_ids:
            log = open(spec.workdir / "logs" / f"{device}.log", "w")
            procs[device] = subprocess.Popen(device_command(device, g, spec.broker, data[device], spec.workdir,
                                                            credentials, ca_file, spec.enforce_memory,
                                                            spec.cache_budget,
                                                            native if kinds[g.name] == "native" else None),
                                             stdout=log, stderr=subprocess.STDOUT)
    runs = ", ".join(f"{g.name}: {kinds[g.name]} agent, {g.runtime}" for g in fleet.groups)
    say(f"{len(procs)} devices started ({runs}); logs in {spec.workdir / 'logs'}; Ctrl-C stops them")
    return procs


def agent_kinds(fleet, override: Optional[str], say: Callable[[str], None]) -> dict[str, str]:
    """Group -> the agent kind its devices run: the group's own (what its plan counted) or `override` (--agent)
    where that agent can train the group's runtime, with a line for each group whose plan counted another."""
    kinds = {}
    for g in fleet.groups:
        wanted = override or g.agent
        kinds[g.name] = wanted if g.runtime == "executorch" else "python"
        if kinds[g.name] != g.agent:
            say(f"group {g.name}: --agent {override} runs the {kinds[g.name]} agent, but its plan counted the "
                f"{g.agent} agent's memory: give the group 'agent: {kinds[g.name]}' in the fleet file to plan for it")
        elif override and wanted != kinds[g.name]:
            say(f"group {g.name}: runtime {g.runtime}: the native agent trains ExecuTorch sets only, so its devices "
                f"run the Python agent, as its plan counted")
    return kinds


def supervise(procs: dict[str, subprocess.Popen], logs: Path, stop: threading.Event,
              warn: Callable[[str], None]) -> None:
    """Until `stop` is set or every agent has exited: name each agent that exits; then stop the rest, killing
    any that has not said goodbye within STOP_GRACE_S. EdgeflError when every agent died on its own."""
    procs, exited = dict(procs), {}
    while not stop.wait(1.0):
        if dead := {d: p.returncode for d, p in procs.items() if p.poll() is not None}:
            for d, rc in sorted(dead.items()):
                warn(f"{d} exited ({rc}): {last_line(logs / f'{d}.log')}; log {logs / f'{d}.log'}")
                del procs[d]
            exited.update(dead)
            if not procs:
                break
    for p in procs.values():
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for d, p in procs.items():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:    # stuck saying goodbye (a slow broker): its trainer dies with it
            p.kill()
            p.wait()
            warn(f"{d} did not stop within {STOP_GRACE_S:.0f} s: killed (its will marks it offline); "
                 f"log {logs / f'{d}.log'}")
    if not stop.is_set():       # nobody asked them to stop: every agent died on its own
        first = min(exited)
        raise EdgeflError(f"every device agent exited: {listing([f'{d} ({rc})' for d, rc in sorted(exited.items())])}; "
                          f"logs in {logs} ({first}.log ends: {last_line(logs / f'{first}.log')})")


def logins_folder(folder: Path, devices: list[str]) -> tuple[Path, Optional[Path]]:
    """(the folder holding <device>.json for every device, the deployment's CA certificate if it has one):
    `folder` is the deployment folder of 'edgefl broker config -o' or its credentials/ subfolder."""
    for candidate, deployment in ((folder / "credentials", folder), (folder, folder.parent)):
        held = [d for d in devices if (candidate / f"{d}.json").is_file()]
        if held:
            if missing := [d for d in devices if d not in held]:
                raise ConfigError(f"--credentials-dir {folder}: no login for {listing(missing)} in {candidate} "
                                  f"(it has {len(held)} of the fleet's {len(devices)}); run 'edgefl broker config "
                                  f"--devices' with this fleet file (or the fleet it is a subset of) to add them")
            ca = deployment / "tls" / "ca.crt"
            return candidate, ca if ca.is_file() else None
    raise ConfigError(f"--credentials-dir {folder}: neither it nor {folder / 'credentials'} holds device logins "
                      f"(looked for {devices[0]}.json); give the folder of 'edgefl broker config -o DIR' or its "
                      "credentials/ folder")


def last_line(log: Path) -> str:
    """What an agent said last (its one-line error, when it died of one)."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][-300:] if lines else "its log is empty"
