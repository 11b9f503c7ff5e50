"""Each device's share of a data set, as `edgefl emulate` and `edgefl fleet up` give it: the partition's
split of the training examples over the fleet's devices in sorted device order, then cut to the
`examples:` of the device's group, so that a device trains on exactly the data the plan's FLOPs assume
(`edgefl.planning.plan.round_flops`). An iid split gives each device of a group with `examples:` that many
(the groups without one share the rest), so groups of different sizes fit a data set their total fits; the
other partitions size their clients themselves. A share smaller than its group's `examples:` is an error, not
a silent shortfall."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.errors import ConfigError
from edgefl.units import listing


def device_shares(fleet, train, partition: str, seed: int, *, source: str = "the data set") -> dict[str, np.ndarray]:
    """{device: indices into `train`} for every device of `fleet`."""
    from edgefl.data.partition import parse_partition

    devices = sorted(d for g in fleet.groups for d in g.device_ids)
    split = parse_partition(partition)
    sizes = None
    if split.kind == "iid":
        examples = {d: g.examples for g in fleet.groups for d in g.device_ids}
        asked = sum(g.count * g.examples for g in fleet.groups if g.examples)
        if asked > len(train.y):
            groups = listing([f"{g.name} {g.count} x {g.examples}" for g in fleet.groups if g.examples])
            raise ConfigError(f"fleet.groups.*.examples: the groups ask for {asked:,} examples ({groups}) and {source} "
                              f"has {len(train.y):,}; lower some group's examples, or drop --train-limit")
        sizes = [examples[d] for d in devices]
    shares = split.split(train.y, len(devices), seed, groups=getattr(train, "groups", None), sizes=sizes)
    if len(shares) < len(devices):
        raise ConfigError(f"--partition {partition}: the data has {len(shares)} natural clients for "
                          f"{len(devices)} devices; use a smaller fleet or another partition")
    out = dict(zip(devices, shares[: len(devices)], strict=True))
    for g in fleet.groups:
        if g.examples is None:
            continue
        short = {d: len(out[d]) for d in g.device_ids if len(out[d]) < g.examples}
        if short:
            device, have = min(short.items(), key=lambda kv: kv[1])
            raise ConfigError(f"fleet.groups.{g.name}.examples: {g.examples}, but {len(short)} of its devices get "
                              f"fewer from {source} ({device}: {have}, partition {partition} over {len(devices)} "
                              "devices); lower examples, drop --train-limit, or use a larger data set")
        for d in g.device_ids:
            out[d] = out[d][: g.examples]
    return out


def save_share(folder: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """A device's examples as FOLDER/x.npy and FOLDER/y.npy (int64 targets): the local data `edgefl-device`
    reads (edgefl.device_runtime.local_data)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", np.ascontiguousarray(x))
    np.save(folder / "y.npy", np.asarray(y, np.int64))
    return folder
