"""An emulated run, end to end: what `edgefl emulate` does between parsing its options and printing.

`EmulatedRun.start(Emulation(...))` checks what could only fail late (CUDA, Ray, the run folder, the options
that go together), loads the data (a seeded subset where asked), plans the fleet, splits the training set into
the devices' shares and writes the run folder's `config.json` and `plan.json`; `train` runs the round loop on
the local engine (devices in this process) or in the actors of a Ray cluster, appends each round to
`history.json`, checkpoints the run after every round in `checkpoint/` (edgefl.server.runstate: global
weights, the strategy with its online state, e.g. ProFL's step and EM history) and writes `weights.pt` at
the end. A run folder holds exactly what `edgefl report` reads.

`resume`: a stopped run (killed, out of time) continues from its last checkpoint and ends exactly as the
uninterrupted run would (but for wall times): every random draw of the round loop is seeded by the run's
seed and the round (devices sampled, device seeds, local shuffles, TOA, new output modules), so nothing
random carries over from one round to the next but what the checkpoint holds. The run must be resumed
with the settings it was started with (its config.json).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

import edgefl
from edgefl.data import Dataset, load_split, parse_partition
from edgefl.data.shares import device_shares
from edgefl.engines.run_options import RunOptions
from edgefl.errors import ConfigError
from edgefl.fleet import Fleet, load_fleet
from edgefl.outdir import check_output, make_output
from edgefl.planning.plan import Plan
from edgefl.planning.planner import plan_fleet, strategy_for
from edgefl.planning.strategies import Strategy
from edgefl.server.coordinator import LoopSettings
from edgefl.server.history import RoundRecord
from edgefl.server.runstate import RunState
from edgefl.zoo import ModelRef
from edgefl.zoo.from_options import model_for_data

RUN_FILES = ("config.json", "plan.json", "history.json")   # what marks a folder as a run --force may replace
CHECKPOINT = "checkpoint"      # the run folder's subfolder its checkpoints live in
ENGINES = ("local", "ray")


def is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_FILES)


@dataclass(kw_only=True)
class Emulation(RunOptions):
    """What to emulate: the fleet file, the model (`layers`, `classes`, `input_shape` as `edgefl.zoo.from_options`
    takes them), the data set and its split over the devices, the method, the round loop's settings, where the
    devices train (`engine`: local | ray, at `address`) and the run folder (`output`; `force` replaces an
    earlier run there). `pretrained`: a set written by `edgefl pretrain` the transformer starts from. `toa`:
    FedOLF's TOA share of filters sent. `measure_memory`: devices fail a round their measured peak exceeds."""
    devices: Path
    model: str
    dataset: str
    method: str
    rounds: int
    output: Path
    force: bool = False
    clients_per_round: int = 10
    partition: str = "iid"
    device: str = "cpu"
    batch_size: int = 32
    local_epochs: int = 1
    train_limit: Optional[int] = None
    layers: Optional[list[int]] = None
    classes: Optional[int] = None
    input_shape: Optional[tuple[int, ...]] = None
    toa: Optional[float] = None
    measure_memory: bool = False
    pretrained: Optional[Path] = None
    engine: str = "local"
    address: Optional[str] = None
    resume: bool = False

    def check(self) -> None:
        """What would fail only after the data loads or minutes of training, checked before either."""
        from edgefl.device_runtime.trainers.torch_trainer import resolve_device

        resolve_device(self.device)   # CUDA asked for and absent
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine: expected local or ray, got {self.engine!r}")
        if self.address is not None and self.engine != "ray":
            raise ConfigError("--address: it names a Ray cluster; add --engine ray")
        if self.engine == "ray":   # Ray missing, or no cluster at --address
            from edgefl.engines.ray import check_address
            from edgefl.transport.ray_transport import import_ray

            import_ray()
            if self.address is not None:
                check_address(self.address)
        if self.resume:
            self.check_resumable()
        else:
            check_output(self.output, self.force, "run", is_run)
        if self.pretrained is not None and self.model != "transformer":
            raise ConfigError(f"--pretrained: the pretrained set holds transformers; use --model transformer, "
                              f"not {self.model}")
        if self.toa is not None and self.toa <= 0:
            raise ConfigError(f"--toa {self.toa}: the share of filters sent must be in (0, 1]")
        parse_partition(self.partition)

    def check_resumable(self) -> None:
        if self.force:
            raise ConfigError("--resume continues the run in -o and --force replaces it: give one of them")
        pointer = self.output / CHECKPOINT / "checkpoint.json"
        if not pointer.is_file():
            raise ConfigError(f"-o {self.output}: no checkpoint to resume ({pointer} is missing: "
                              f"{'no round of it finished' if is_run(self.output) else 'it is not a run folder'}); "
                              "run without --resume to start it afresh (--force to replace it)")

    def check_same_run(self, config: dict) -> None:
        """A resumed run has the settings it was started with (its config.json), or it is another run."""
        path = self.output / "config.json"
        try:
            before = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: unreadable ({exc}); a run can only be resumed with its config.json") from None
        changed = [k for k in sorted(set(before) | set(config)) if k != "edgefl_version" and before.get(k) != config.get(k)]
        if changed:
            k = changed[0]
            raise ConfigError(f"{path}: the run in {self.output} was started with {k} = {before.get(k)!r}, not "
                              f"{config.get(k)!r}{f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''}; "
                              "resume it with the options it was started with, or drop --resume and give another -o")

    def config_json(self, model: ModelRef, train: Dataset, test: Dataset) -> dict:
        """The run's config.json: its settings as given, the model it trains, the data it holds."""
        ray = {"engine": "ray", "ray_address": self.address} if self.engine == "ray" else {}
        return {"devices": str(self.devices), "model": model.to_json(), "dataset": self.dataset,
                "method": self.method, "rounds": self.rounds, "clients_per_round": self.clients_per_round,
                "partition": self.partition, "device": self.device, "seed": self.seed, "batch_size": self.batch_size,
                "local_epochs": self.local_epochs, "lr": self.lr, "toa": self.toa,
                "measure_memory": self.measure_memory,
                "pretrained": str(self.pretrained) if self.pretrained else None, "train_examples": len(train.y),
                **ray, "test_examples": len(test.y), "edgefl_version": edgefl.version()}

    def settings(self) -> LoopSettings:
        return LoopSettings(rounds=self.rounds, clients_per_round=self.clients_per_round, seed=self.seed,
                            eval_every=self.eval_every, lr=self.lr, lr_final=self.lr / 10,
                            measure_memory=self.measure_memory)


@dataclass
class EmulatedRun:
    """A planned emulation, its run folder written up to the plan."""
    spec: Emulation
    fleet: Fleet
    strategy: Strategy
    plan: Plan
    train_set: Dataset
    test_set: Dataset
    shares: list[np.ndarray]                # per device in sorted order: indices into the training set
    initial: Optional[dict] = None          # the pretrained weights it starts from

    @classmethod
    def start(cls, spec: Emulation) -> "EmulatedRun":
        spec.check()
        fleet = load_fleet(spec.devices)
        options = {}
        if spec.pretrained is not None:
            from edgefl.zoo.pretrained import fine_tuning_data_options

            options = fine_tuning_data_options(spec.pretrained, spec.dataset)
        train = load_split(spec.dataset, "train", spec.data_root, spec.train_limit, spec.seed, **options)
        test = load_split(spec.dataset, "test", spec.data_root, spec.test_limit, spec.seed, **options)
        model, depths = cls._model(spec, train)
        strategy = strategy_for(spec.method, depths)
        plan = plan_fleet(strategy, fleet, model, rounds=spec.rounds, batch_size=spec.batch_size,
                          local_epochs=spec.local_epochs, where=str(spec.devices))
        share_of = device_shares(fleet, train, spec.partition, spec.seed, source=spec.dataset)
        initial = None
        if spec.pretrained is not None:
            from edgefl.zoo.pretrained import load_pretrained

            initial = load_pretrained(spec.pretrained, plan.model)   # CAFF may have chosen another depth
        config = spec.config_json(plan.model, train, test)
        if spec.resume:     # the folder's config and plan stay as the run wrote them
            spec.check_same_run(json.loads(json.dumps(config)))
        else:
            make_output(spec.output, spec.force)
            (spec.output / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            plan.write(spec.output / "plan.json")
        return cls(spec, fleet, strategy, plan, train, test, [share_of[d] for d in sorted(share_of)], initial)

    @staticmethod
    def _model(spec: Emulation, train: Dataset) -> tuple[ModelRef, Optional[list[int]]]:
        """The model to train and the depths CAFF chooses among (None: the method's own)."""
        if spec.pretrained is None:
            return model_for_data(spec.model, train, spec.layers, spec.classes, spec.input_shape), None
        from edgefl.zoo.pretrained import pretrained_ref

        model, depths = pretrained_ref(spec.pretrained, spec.layers, train)
        return model, depths if spec.method == "caff" else None

    def train(self, on_round: Callable[[RoundRecord], None] = lambda record: None,
              say: Callable[[str], None] = print) -> list[RoundRecord]:
        """Run every round not yet run (each appended to history.json and checkpointed, then `on_round`); the
        global weights go to weights.pt. `say`: where a line about the engine goes. Returns every round's
        record, those of a resumed run's earlier rounds included."""
        from edgefl.engines.local import emulate

        spec = self.spec
        state = RunState(spec.output / CHECKPOINT, history=spec.output / "history.json", journal=False)
        if spec.resume:
            say(f"resuming {spec.output} after round {state.completed()} of {spec.rounds}")
        with self._engine(say) as transport:
            records, server = emulate(self.fleet, self.plan, self.strategy, self.plan.model, self.train_set,
                                      self.test_set, self.shares, spec.settings(), spec.device, on_round, toa=spec.toa,
                                      initial_state=self.initial, transport=transport, state=state)
        server.save(spec.output / "weights.pt")
        return records

    @contextmanager
    def _engine(self, say: Callable[[str], None]) -> Iterator[Callable]:
        """The transport the devices run behind: in this process, or in the actors of a Ray cluster."""
        if self.spec.engine == "local":
            from edgefl.transport.memory import InMemoryTransport

            yield InMemoryTransport
            return
        from edgefl.engines.ray import ray_engine

        with ray_engine(self.spec.address, self.plan.model, self.spec.device) as ray:
            say(ray.describe())
            yield ray


def final_accuracy(records: list[RoundRecord]) -> Optional[float]:
    """The last evaluated round's accuracy (None: no round was evaluated)."""
    return next((r.accuracy for r in reversed(records) if r.accuracy is not None), None)

