"""`edgefl pretrain`: the CAFF set of pretrained tiny language models (edgefl.zoo.pretrain), one folder per depth."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from edgefl.cli import options as o
from edgefl.cli.console import stdout


def _plays(text: Optional[str], data_root: Optional[Path]) -> Optional[list[str]]:
    from edgefl.data.shakespeare import read_works
    from edgefl.errors import ConfigError

    if text is None:
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = read_works(data_root).plays
    if unknown := sorted(set(names) - set(known)):
        raise ConfigError(f"--plays: no play named {', '.join(unknown)}; the plays are: {', '.join(sorted(known))}")
    if not names:
        raise ConfigError("--plays: name at least one play (or leave the option out for the default four)")
    return names


Steps = Annotated[int, typer.Option("--steps", min=1, help="optimizer steps per model")]
PeakLr = Annotated[float, typer.Option("--lr", min=0.0, help="peak AdamW learning rate (decays to a tenth)")]
Context = Annotated[int, typer.Option("--context", min=2, help="window length (the Shakespeare clients' is 80)")]
EvalEvery = Annotated[int, typer.Option("--eval-every", min=0, help="measure the validation loss every N steps and "
                                        "keep the best checkpoint (0: keep the last)")]
Patience = Annotated[int, typer.Option("--patience", min=0, help="stop after this many validation measurements "
                                       "without a new best (0: run every step)")]
Plays = Annotated[Optional[str], typer.Option("--plays", help="comma-separated plays pretrained on beside the poems "
                                              "(default: the four kept out of the federated clients); a run "
                                              "fine-tuning the set keeps them out of its clients")]
Dropout = Annotated[float, typer.Option("--dropout", min=0.0, max=0.9, help="dropout on the embedding and each "
                                        "block's attention and MLP outputs while pretraining (CAFF: 0.05); "
                                        "fine-tuning never uses it")]
From = Annotated[Optional[Path], typer.Option("--from", help="continue the models of this set (same corpus and model "
                                              "sizes) instead of starting from random weights; -o must be another "
                                              "folder")]
Resume = Annotated[bool, typer.Option("--resume", help="continue the depths a stopped run into -o left unfinished, "
                                      "with the same settings; depths it finished are kept")]


def pretrain(output: Annotated[Path, typer.Option("-o", "--output", help="folder for layers-<l>/{weights.pt,"
                                                  "config.json}")],
             layers: Annotated[str, typer.Option("--layers", help="depths to pretrain (CAFF: 3,6,9,12)")] = "3,6,9,12",
             steps: Steps = 200, batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="windows per "
                                                                                   "step")] = 16,
             lr: PeakLr = 2e-3, lr_final: Annotated[Optional[float], typer.Option("--lr-final", min=0.0, help="the "
                                                                   "rate the decay ends at (default: --lr / 10)")] = None,
             context: Context = 80, embed: Annotated[int, typer.Option("--embed", min=1, help="embedding width")] = 96,
             heads: Annotated[int, typer.Option("--heads", min=1, help="attention heads")] = 3, seed: o.Seed = 0, eval_every: EvalEvery = 0,
             patience: Patience = 0, plays: Plays = None, dropout: Dropout = 0.0, start: From = None,
             resume: Resume = False, device: o.TorchDevice = "cpu",
             data_root: Annotated[Optional[Path], typer.Option("--data-root", help="where the shakespeare package "
                                                               "data lives")] = None):
    """Pretrain tiny causal transformers on the public-domain corpus, for 'edgefl emulate --pretrained'."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from edgefl.data import pretrain_corpus
    from edgefl.device_runtime.trainers.torch_trainer import resolve_device
    from edgefl.zoo.pretrain import PretrainSettings, depths_to_train, pretrain_set
    from edgefl.zoo.pretrained import folder_for

    resolve_device(device)
    settings = PretrainSettings(steps=steps, batch_size=batch_size, lr=lr, lr_final=lr_final, context=context,
                                embed=embed, heads=heads, seed=seed, eval_every=eval_every, patience=patience,
                                dropout=dropout, device=device)
    settings.check()
    depths = o.parse_int_list(layers, "--layers")
    corpus = pretrain_corpus(data_root, holdout=_plays(plays, data_root))
    stdout.print(f"corpus {corpus.name}: {len(corpus.tokens)} tokens, vocabulary {len(corpus.vocab)}, "
                 f"{len(corpus.works)} works; {steps} steps of {batch_size} x {context} tokens per model")
    depths, kept = depths_to_train(output, depths, resume)
    for depth in kept:
        stdout.print(f"{depth} layers: already written to {folder_for(output, depth)}, kept")
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"),
                  console=stdout) as bar:
        tasks: dict[int, int] = {}

        def on_step(depth: int):
            task = tasks[depth] = bar.add_task(f"{depth} layers", total=steps, loss="")
            return lambda step, loss: bar.update(task, completed=step, loss=f"loss {loss:.3f}")

        for depth, folder, summary in pretrain_set(output, depths, settings, corpus, start, on_step):
            bar.update(tasks[depth], loss=f"held-out loss {summary['held_out_loss']:.3f}")
            stdout.print(_written(depth, folder, summary))


def _written(depth: int, folder: Path, summary: dict) -> str:
    chosen = (f" (checkpoint of step {summary['best_step']} of {summary['steps']}, validation loss "
              f"{summary['validation_loss']:.3f})") if "best_step" in summary else ""
    return (f"{depth} layers: {summary['params']} parameters, train loss {summary['train_loss']:.3f}, "
            f"held-out loss {summary['held_out_loss']:.3f}{chosen}, {summary['seconds']:.1f} s -> {folder}")
