"""Which of a round's artifacts travel on a group's retained topics (published once for every device of the
group) and which on a device's own: decided by content, per name. Under a name (the weights; each file of an
artifact set, by its name in the set), a round's first device of the group gets its bytes through the group;
as long as the group's next devices get the same bytes they do too, and once one gets other bytes (Federated
Dropout's random slices, a TOA-shrunk prefix) the rest of the round gets theirs on their own topics, as does
the next round if this one differed. What a group got before under a name is cleared from the broker as soon
as it gets something else under it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from edgefl.transport.artifact_server import ArtifactServer


@dataclass
class _Route:
    """What a group's devices got under one name in a round."""
    round: int
    first: str                   # the artifact the round's first device got
    shared: bool                 # the round's devices get it through the group's topics
    alike: bool = True           # every device so far got `first`


class GroupRoutes:
    def __init__(self, artifacts: ArtifactServer):
        self.artifacts = artifacts
        self._group_of: dict[str, str] = {}                       # device -> group
        self._routes: dict[tuple[str, str], _Route] = {}          # (group, name) -> what its devices get
        self._shared: dict[str, dict[str, str]] = {}              # device -> artifact -> group, until its send
        self._named: dict[tuple[str, str], str] = {}              # (group, name) -> what the group gets now

    def groups(self, group_of: dict[str, str]) -> None:
        self._group_of = dict(group_of)

    def route(self, device: str, name: str, artifact: str, round: int) -> Optional[str]:
        """The group whose topics carry `artifact` to `device` under `name` in `round`, or None: its own."""
        group = self._group_of.get(device)
        if group is None:
            return None
        key = (group, name)
        route = self._routes.get(key)
        if route is None or route.round != round:   # a round starts shared unless the last one differed
            route = self._routes[key] = _Route(round, artifact, shared=route is None or route.alike)
        elif artifact != route.first:
            route.alike = route.shared = False
        return group if route.shared else None

    def shared(self, device: str, artifact: str, group: str, name: str) -> None:
        """`device` gets `artifact` from `group`'s topics: what the group got before under `name` (an earlier
        round's weights) is cleared from the broker at once, unless another name still has it."""
        self._shared.setdefault(device, {})[artifact] = group
        old, self._named[(group, name)] = self._named.get((group, name)), artifact
        if old is not None and old != artifact and (group, old) not in {(g, a) for (g, _), a in self._named.items()}:
            self.artifacts.retire(math.inf, only=(group, old))

    def take_shared(self, device: str) -> dict[str, str]:
        """What the device's next instruction names as its group's (artifact -> group), forgotten after."""
        return self._shared.pop(device, {})
