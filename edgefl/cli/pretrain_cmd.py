"""`edgefl pretrain`: the CAFF set of pretrained tiny language models (edgefl.zoo.pretrain), one folder per depth."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


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


def pretrain(
    output: Path = typer.Option(..., "-o", "--output", help="folder for layers-<l>/{weights.pt,config.json}"),
    layers: str = typer.Option("3,6,9,12", "--layers", help="depths to pretrain (CAFF: 3,6,9,12)"),
    steps: int = typer.Option(200, "--steps", min=1, help="optimizer steps per model"),
    batch_size: int = typer.Option(16, "--batch-size", min=1),
    lr: float = typer.Option(2e-3, "--lr", min=0.0, help="peak AdamW learning rate (decays to a tenth)"),
    lr_final: Optional[float] = typer.Option(None, "--lr-final", min=0.0),
    context: int = typer.Option(80, "--context", min=2, help="window length (the Shakespeare clients' is 80)"),
    embed: int = typer.Option(96, "--embed", min=1),
    heads: int = typer.Option(3, "--heads", min=1),
    seed: int = typer.Option(0, "--seed"),
    eval_every: int = typer.Option(0, "--eval-every", min=0,
                                   help="measure the validation loss every N steps and keep the best checkpoint (0: keep the last)"),
    patience: int = typer.Option(0, "--patience", min=0,
                                 help="stop after this many validation measurements without a new best (0: run every step)"),
    plays: Optional[str] = typer.Option(None, "--plays",
                                        help="comma-separated plays pretrained on beside the poems (default: the "
                                             "four kept out of the federated clients); a run fine-tuning the set "
                                             "keeps them out of its clients"),
    dropout: float = typer.Option(0.0, "--dropout", min=0.0, max=0.9,
                                  help="dropout on the embedding and each block's attention and MLP outputs while "
                                       "pretraining (CAFF: 0.05); fine-tuning never uses it"),
    start: Optional[Path] = typer.Option(None, "--from",
                                         help="continue the models of this set (same corpus and model sizes) "
                                              "instead of starting from random weights; -o must be another folder"),
    resume: bool = typer.Option(False, "--resume",
                                help="continue the depths a stopped run into -o left unfinished, with the same "
                                     "settings; depths it finished are kept"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="where the shakespeare package data lives"),
):
    """Pretrain tiny causal transformers on the public-domain corpus, for 'edgefl emulate --pretrained'."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from edgefl.cli.console import stdout
    from edgefl.cli.options import parse_int_list
    from edgefl.data import pretrain_corpus
    from edgefl.device_runtime.trainers.torch_trainer import resolve_device
    from edgefl.errors import ConfigError
    from edgefl.zoo.pretrain import PretrainSettings, checkpoint_for, continuation, model_ref, write
    from edgefl.zoo.pretrain import pretrain as train_one
    from edgefl.zoo.pretrained import folder_for

    resolve_device(device)
    if patience and not eval_every:
        raise ConfigError("--patience needs --eval-every N (the validation loss is what it waits on)")
    if embed % heads:
        raise ConfigError(f"--embed {embed} must be a multiple of --heads {heads}")
    depths = parse_int_list(layers, "--layers")
    if start is not None and start.resolve() == output.resolve():
        raise ConfigError(f"--from {start}: the same folder as -o; write the continued set to another folder, so "
                          "the set it starts from stays whole if the run is stopped")
    settings = PretrainSettings(steps=steps, batch_size=batch_size, lr=lr, lr_final=lr_final, context=context,
                                embed=embed, heads=heads, seed=seed,
                                eval_every=eval_every, patience=patience, dropout=dropout,
                                device=device)
    corpus = pretrain_corpus(data_root, holdout=_plays(plays, data_root))
    stdout.print(f"corpus {corpus.name}: {len(corpus.tokens)} tokens, vocabulary {len(corpus.vocab)}, "
                 f"{len(corpus.works)} works; {steps} steps of {batch_size} x {context} tokens per model")
    unfinished = [d for d in depths if checkpoint_for(output, d).exists()]
    if unfinished and not resume:
        raise ConfigError(f"-o {output}: a stopped run left layers {', '.join(map(str, unfinished))} unfinished "
                          "(checkpoint.pt); add --resume to continue it, or choose another folder")
    if resume:
        done = [d for d in depths if d not in unfinished and (folder_for(output, d) / "config.json").exists()]
        for depth in done:
            stdout.print(f"{depth} layers: already written to {folder_for(output, depth)}, kept")
        depths = [d for d in depths if d not in done]
    starts = {depth: continuation(start, model_ref(depth, len(corpus.vocab), settings), corpus)
              for depth in depths} if start is not None else {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"),
                  console=stdout) as bar:
        for depth in depths:
            task = bar.add_task(f"{depth} layers", total=steps, loss="")
            begun = starts.get(depth)
            ref, state, summary = train_one(corpus, depth, settings,
                                            lambda step, loss: bar.update(task, completed=step, loss=f"loss {loss:.3f}"),
                                            begun[:2] if begun else None, checkpoint_for(output, depth))
            if begun:
                summary.update(stages=begun[2], total_steps=begun[1] + summary.get("best_step", summary["steps"]))
            folder = write(output, ref, state, corpus, settings, summary)
            checkpoint_for(output, depth).unlink(missing_ok=True)
            bar.update(task, loss=f"held-out loss {summary['held_out_loss']:.3f}")
            chosen = (f" (checkpoint of step {summary['best_step']} of {summary['steps']}, validation loss "
                      f"{summary['validation_loss']:.3f})") if "best_step" in summary else ""
            stdout.print(f"{depth} layers: {summary['params']} parameters, train loss {summary['train_loss']:.3f}, "
                         f"held-out loss {summary['held_out_loss']:.3f}{chosen}, {summary['seconds']:.1f} s -> {folder}")
