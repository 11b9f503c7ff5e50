"""Deployment: the coordinator's round loop driving real devices over MQTT.

An engine because it wires the export room into the server. Not a second system: the same
Coordinator, strategy and aggregation as `edgefl emulate`, the same global model (`TorchServerModel`,
seeded the same way); what differs is what an instruction carries. Instead of tensors, a device gets the
artifact set of its config for its runtime, filled with its slice of the current global weights:

* a set is exported once per (config, runtime, index sets) and only has its weights replaced in later
  rounds (`edgefl.export.pipeline.refresh_weights`), once per round however many devices train it; each
  weights version in a folder of its own (the previous version's files copied, then refreshed), since what
  was shipped under a sha256 is never rewritten: a device still fetching the last round's set gets its bytes
  (or drops it, when it hears the round is over), never a mix;
* shipping it (`WireTransport.ship_artifact`) offers the manifest and every file by sha256: a device
  fetches only what its cache lacks, so unchanged graphs and an unchanged frozen prefix never travel twice;
* the instruction carries the set's id and the plan's predicted peak (the coordinator's: a set's manifest holds
  the built-in constants' prediction, a calibrated plan its own), which the device checks against the memory it
  grants before it trains, the memory budget of the device's group
  (`memory_budget_bytes`: what the plan fits, and what a device that declared none grants and is capped at),
  and the bytes its upload may hold (`upload_bytes`), past which the transport refuses it.
"""
from __future__ import annotations

import hashlib
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Optional

from edgefl.errors import ConfigError
from edgefl.fleet import Fleet, Group, device_id
from edgefl.messages import RoundInstruction
from edgefl.planning.plan import Plan
from edgefl.server.coordinator import Delivery
from edgefl.server.global_model import TorchServerModel

SET_ROLE = "set"     # edgefl.device_runtime.agent.SET_ROLE: the role of a suffix set in an instruction


def fleet_of(plan: Plan, fleet: Optional[Fleet] = None, where: str = "--devices") -> Fleet:
    """The fleet a plan was made for: `fleet` when given (it must have the plan's groups with the plan's device
    counts: a plan served to another fleet would wait for devices it has no plan for, or plan for devices
    that never come), else one rebuilt from the plan with device ids as a fleet file's `count: N` names them."""
    if fleet is not None:
        _check_same_fleet(plan, fleet, where)
        return fleet
    groups = []
    for name, g in plan.groups.items():
        ids = tuple(device_id(name, i) for i in range(g.count))
        groups.append(Group(name, ids, g.memory_budget_bytes, g.upload_budget_bytes, g.flops_budget, g.runtime,
                            g.examples, None, g.agent))
    return Fleet(name="plan", groups=tuple(groups))


def _check_same_fleet(plan: Plan, fleet: Fleet, where: str) -> None:
    from edgefl.units import listing

    counts = {g.name: g.count for g in fleet.groups}
    differ = []
    if missing := [g for g in plan.groups if g not in counts]:
        differ.append(f"the plan's group{'s' * (len(missing) > 1)} {listing(missing)} not in the fleet file")
    if extra := [g for g in counts if g not in plan.groups]:
        differ.append(f"the fleet file's group{'s' * (len(extra) > 1)} {listing(extra)} not in the plan")
    differ += [f"{name} has {counts[name]} devices in the fleet file, {g.count} in the plan"
               for name, g in plan.groups.items() if name in counts and g.count != counts[name]]
    if differ:
        raise ConfigError(f"{where} describe different fleets: {'; '.join(differ)}; pass the fleet file the plan "
                          "was made from, or plan again with 'edgefl plan --devices' this file")


def check_deployable(plan: Plan) -> None:
    """Artifacts train one model on cross-entropy, one config per round: methods whose devices train block
    sequences, exits or distilling copies run in the emulation only."""
    for name, g in plan.groups.items():
        for step in g.steps:
            config = step.config
            if step.sequence or getattr(config, "exits", ()) or getattr(config, "copies", 1) > 1 or "mutual-distillation" in g.flags:
                raise ConfigError(f"plan group {name!r} ({plan.method}) trains block sequences, exit heads or "
                                  "distilling copies, which exported artifacts do not run yet; emulate this method "
                                  "with 'edgefl emulate', or plan another one for devices")


class ArtifactShipper:
    """Artifact sets under `root`, per (config, runtime, index sets) and weights version: `<set>/v<version>/`.
    The version before stays while devices may still fetch it; older ones are removed."""

    def __init__(self, root: Path, backend_for: Callable[[str], object]):
        from edgefl.export.pipeline import PrefixCache

        self.root = Path(root)
        self.backend_for = backend_for
        self.prefixes = PrefixCache(self.root / ".prefixes")
        self._version: dict[Path, int] = {}      # set folder -> the weights version its newest folder holds

    def prepare(self, ref, config, indices, runtime: str, state: Mapping, weights_version: int) -> Path:
        from edgefl.export.pipeline import export_set, refresh_weights

        # devices with the same config share a set unless their channel index sets differ (Federated
        # Dropout's random sets, FedRolex's rolling window): the set holds the device's slice of the weights
        tag = hashlib.sha256(repr((indices.widths, sorted(indices.kept.items()))).encode()).hexdigest()[:10]
        base = self.root / f"{config.hash()}-{runtime}-{tag}"
        backend = self.backend_for(runtime)
        if base not in self._version:
            written = _newest_whole(base)      # what a coordinator that was stopped wrote before
            if written is None:
                shutil.rmtree(base, ignore_errors=True)
                export_set(ref, config, state, backend, base / f"v{weights_version}", indices=indices,
                           weights_version=weights_version, cache=self.prefixes)
                written = weights_version
            self._version[base] = written
        current = base / f"v{self._version[base]}"
        if self._version[base] != weights_version:
            fresh = base / f"v{weights_version}"
            shutil.rmtree(fresh, ignore_errors=True)      # a half-written one of a coordinator that was killed
            shutil.copytree(current, fresh)
            refresh_weights(fresh, state, backend, indices=indices, weights_version=weights_version,
                            cache=self.prefixes)
            for old in base.glob("v*"):
                if old not in (current, fresh):
                    shutil.rmtree(old, ignore_errors=True)
            self._version[base], current = weights_version, fresh
        return current


def _newest_whole(base: Path) -> Optional[int]:
    """The newest weights version under a set folder whose files all match its manifest (None: none)."""
    from edgefl.errors import ArtifactError
    from edgefl.manifest import ArtifactSet

    for folder in sorted(base.glob("v*"), key=lambda p: -int(p.name[1:]) if p.name[1:].isdigit() else 0):
        try:
            return ArtifactSet.open(folder).suffix.weights_version
        except (ArtifactError, OSError, ValueError):
            continue
    return None


def as_exported(instruction: RoundInstruction) -> RoundInstruction:
    """The instruction as an exported artifact set carries it out: the set trains its config's whole trainable
    suffix, so a ProFL device that affords no block trains the whole output module there, not its output
    layer alone (a departure from ProFL sec. 4.1 on devices, said in its docstring), and uploads all of it."""
    return replace(instruction, options=tuple((k, v) for k, v in instruction.options if k != "output_layer_only"))


class DeployedServerModel(TorchServerModel):
    """The global model of a served run: as in emulation, but each delivery is an artifact set shipped to
    the device (its id in `Delivery.artifacts`) instead of tensors."""

    def __init__(self, *args, shipper: ArtifactShipper, ship: Callable[[str, Path], str],
                 runtime_of: Mapping[str, str], budget_of: Mapping[str, int], **kwargs):
        """`runtime_of`, `budget_of`: each device's runtime and its group's memory budget."""
        super().__init__(*args, **kwargs)
        self.shipper, self.ship, self.runtime_of = shipper, ship, dict(runtime_of)
        self.budget_of = dict(budget_of)

    def weights_for(self, instruction: RoundInstruction, device_seed: int) -> Delivery:
        delivery = super().weights_for(as_exported(instruction), device_seed)
        parts, expected = delivery.handle
        (config, indices), = parts          # check_deployable: one config per instruction
        folder = self.shipper.prepare(self.ref, config, indices, self.runtime_of[instruction.device_id], self.state,
                                      instruction.weights_version)
        delivery.artifacts = {SET_ROLE: self.ship(instruction.device_id, folder)}
        delivery.weights = {}
        delivery.options["memory_budget_bytes"] = self.budget_of[instruction.device_id]
        # the trained tensors as they travel up (one flat float32 buffer): the transport refuses an upload
        # past this before it holds the rest of it
        delivery.options["upload_bytes"] = 4 * sum(math.prod(shape) for shape, _ in expected.values())
        return delivery
