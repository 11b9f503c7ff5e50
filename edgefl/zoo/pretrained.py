"""A pretrained set as `edgefl pretrain` writes it (edgefl.zoo.pretrain): DIR/layers-<l>/weights.pt (the
transformer's state dict) and DIR/layers-<l>/config.json (schema, the model as a ModelRef, the vocabulary, the
corpus, its works and plays, the settings, the measured losses). What a run that starts from one reads:
which depths it holds, the model to fine-tune, its weights, and which plays its clients must not hold."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from edgefl.errors import ConfigError
from edgefl.zoo import ModelRef, build

SCHEMA = "edgefl.pretrained/1"


def folder_for(root: Path, layers: int) -> Path:
    return Path(root) / f"layers-{layers}"


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.exists() and (Path(folder) / "checkpoint.pt").exists():
        raise ConfigError(f"{folder}: unfinished (a stopped 'edgefl pretrain' left checkpoint.pt); finish it with "
                          f"'edgefl pretrain --resume -o {Path(folder).parent}' and the options it was started with")
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror}); write the set with 'edgefl pretrain -o DIR'") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc}); rewrite the set with 'edgefl pretrain -o DIR'") from None
    if not isinstance(config, dict) or config.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: schema is not {SCHEMA!r}; rewrite the set with 'edgefl pretrain -o DIR'")
    return config


def available(root: Path, option: str = "--pretrained") -> dict[int, dict]:
    """The pretrained set in `root` (named `option` on the command line): depth -> its config.json."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{option} {root}: no such folder; write one with 'edgefl pretrain -o {root}'")
    found = {}
    for folder in sorted(root.glob("layers-*")):
        config = read_config(folder)
        found[ModelRef.from_json(config["model"]).args["layers"]] = config
    if not found:
        raise ConfigError(f"{option} {root}: no layers-<l>/ folders; write them with 'edgefl pretrain -o {root}'")
    return found


def pretrained_plays(root: Path) -> list[str]:
    """Every play any model of the set in `root` was pretrained on (a set written before configs listed them
    was pretrained on the default plays)."""
    from edgefl.data.text import PRETRAIN_PLAYS

    return sorted({p for c in available(root).values()
                   for p in c.get("plays", [w for w in c.get("works", []) if w in PRETRAIN_PLAYS])})


def fine_tuning_data_options(root: Path, dataset: str) -> dict:
    """`load_dataset` options for fine-tuning the set in `root` on `dataset`: on Shakespeare, the clients hold
    none of the plays the set was pretrained on, so no client's text, and no test window, was pretrained on."""
    return {"holdout": pretrained_plays(root)} if dataset == "shakespeare" else {}


def load_pretrained(root: Path, ref: ModelRef, option: str = "--pretrained") -> dict:
    """The pretrained weights of `ref` (a transformer of the set in `root`), checked against its shapes."""
    depth = ref.args.get("layers")
    config = available(root, option).get(depth)
    if config is None:
        raise ConfigError(f"{option} {root}: no {depth}-layer model; add it with "
                          f"'edgefl pretrain --layers {depth} -o {root}'")
    if ModelRef.from_json(config["model"]) != ref:
        raise ConfigError(f"{option} {root}: layers-{depth} holds {ModelRef.from_json(config['model']).label()}, "
                          f"not {ref.label()}")
    import torch

    path = folder_for(root, depth) / "weights.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"{path}: cannot read it ({str(exc).splitlines()[0]}); rewrite it with 'edgefl pretrain'") from None
    expected = build(ref).state_dict()
    if not isinstance(state, dict) or set(state) != set(expected) or any(
            tuple(state[k].shape) != tuple(t.shape) for k, t in expected.items()):
        raise ConfigError(f"{path}: the tensors do not match {ref.label()}; rewrite it with 'edgefl pretrain'")
    return state


def pretrained_ref(root: Path, depths: Optional[list[int]], train) -> tuple[ModelRef, list[int]]:
    """(the transformer of the set in `root` to start from, the depths asked for): the first of `depths`, else
    the deepest; the depths default to every one in the set (CAFF chooses among them). `train`: the data set
    it fine-tunes on, whose vocabulary and windows the models must take."""
    found = available(root)
    if missing := sorted(set(depths or ()) - set(found)):
        raise ConfigError(f"--pretrained {root}: no model with {missing} layers (it has {sorted(found)}); "
                          f"add them with 'edgefl pretrain --layers {','.join(map(str, missing))} -o {root}'")
    depths = depths or sorted(found, reverse=True)
    config = found[depths[0]]
    if list(getattr(train, "vocab", None) or []) != config["vocab"]:
        raise ConfigError(f"--pretrained {root}: the models were pretrained on another vocabulary than the data set's; "
                          "pretrain them on this data set's text")
    ref = ModelRef.from_json(config["model"])
    if train.x.ndim != 2 or train.x.shape[1] > ref.args["context"]:
        raise ConfigError(f"--pretrained {root}: the models read at most {ref.args['context']} tokens, the data's "
                          f"windows are {train.x.shape[1:]}; pretrain with --context {train.x.shape[-1]}")
    return ref, depths
