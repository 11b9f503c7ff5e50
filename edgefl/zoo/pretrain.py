"""The CAFF set of pretrained tiny language models, on the public-domain corpus (imports torch).

CAFF (sec. 4.1) pretrains causal transformers with l in {3, 6, 9, 12} blocks (embedding 96, 3 heads) with
AdamW (betas 0.9 / 0.95, weight decay 0.1 on weight matrices) and a sinusoidal learning-rate decay to a tenth,
then fine-tunes them federatedly; CAFF and the baselines (Heterogeneous LoRA, FedHM, ...) start from them. We
train the same architectures on edgefl.data.pretrain_corpus (the poems and the plays kept out of the federated
Shakespeare clients, by default edgefl.data.text.PRETRAIN_PLAYS; the same character vocabulary; a run that
fine-tunes the set keeps every play it was pretrained on out of its clients: `fine_tuning_data_options`) for
as many steps as a few CPU-minutes allow, after a short linear warm-up (a tenth of the steps, at most 100). A
batch is `batch_size` random windows of `context` + 1 tokens; the loss is next-token cross-entropy at every
position, as the torch trainer fine-tunes. The corpus's last `holdout` share is never trained on. Its first
half is the validation text, its second half the test text: the mean loss over (up to `eval_windows` of) the
test text's non-overlapping windows is the held-out loss reported. With `eval_every` > 0 the validation loss
is measured every that many steps and the model kept is the checkpoint where it was lowest (early stopping: on
a corpus this small a long run can overfit, where CAFF's models see theirs once); with `patience` > 0 training
stops after that many measurements without a new best. The test text is never used to choose, so the reported
loss is not chosen on. `dropout` (CAFF pretrains with 0.05 and fine-tunes with none) drops the embedding's
output and each block's attention and MLP outputs before they join the residual stream, as GPT-2 does. It is
applied by forward hooks while pretraining only: the saved state dict, the model edgefl builds and exports,
and every fine-tuning run have no dropout. `edgefl pretrain --from SET` continues a set's models on the same
corpus with new settings (a second schedule: warm-up and decay again); each config lists the earlier parts as
`stages`, and `total_steps` counts the steps behind the weights kept.

A depth in training keeps its whole state (weights, AdamW's moments, the random generators, the validation
curve and best checkpoint) in DIR/layers-<l>/checkpoint.pt every `eval_every` steps (100 without them), so a
stopped run continues with `--resume` where its last checkpoint was and ends as the uninterrupted run would
have: one schedule, however many sittings.

Layout: DIR/layers-<l>/weights.pt (the transformer's state dict) and DIR/layers-<l>/config.json (schema,
the model as a ModelRef, the vocabulary, the corpus, its works and plays, the settings, and the measured
losses and seconds).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch.nn import functional as F

from edgefl.data import Corpus
from edgefl.errors import ConfigError
from edgefl.zoo import ModelRef, build
from edgefl.zoo.pretrained import SCHEMA, folder_for, load_pretrained, read_config

DEPTHS = (3, 6, 9, 12)


@dataclass(frozen=True)
class PretrainSettings:
    steps: int = 300
    batch_size: int = 16
    lr: float = 2e-3
    lr_final: Optional[float] = None          # None: lr / 10 (CAFF's decay)
    weight_decay: float = 0.1
    context: int = 80                         # the federated Shakespeare windows' length
    embed: int = 96
    heads: int = 3
    seed: int = 0
    holdout: float = 0.05
    eval_windows: int = 256
    eval_every: int = 0                       # 0: keep the last step's model
    patience: int = 0                         # 0: run every step
    dropout: float = 0.0
    device: str = "cpu"

    def check(self) -> None:
        if self.patience and not self.eval_every:
            raise ConfigError("--patience needs --eval-every N (the validation loss is what it waits on)")
        if self.embed % self.heads:
            raise ConfigError(f"--embed {self.embed} must be a multiple of --heads {self.heads}")

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then half a cosine from lr down to lr_final."""
        warmup = min(100, max(1, self.steps // 10))
        if step < warmup:
            return self.lr * (step + 1) / warmup
        final = self.lr / 10 if self.lr_final is None else self.lr_final
        progress = (step - warmup) / max(self.steps - warmup - 1, 1)
        return final + 0.5 * (self.lr - final) * (1 + math.cos(math.pi * min(progress, 1.0)))


def model_ref(layers: int, vocab: int, settings: PretrainSettings) -> ModelRef:
    return ModelRef.of("transformer", layers=layers, vocab=vocab, context=settings.context, embed=settings.embed,
                       heads=settings.heads)


def with_dropout(model, p: float) -> list:
    """Hooks that drop `p` of the embedding's output and of every block's attention and MLP outputs in
    training mode (GPT-2's embedding and residual dropout); remove them with `.remove()`."""
    from edgefl.zoo.blocks import Block
    from edgefl.zoo.transformer import TokenEmbedding

    def drop(module, inputs, output):
        return F.dropout(output, p, module.training)
    sites = [m for m in model.modules() if isinstance(m, TokenEmbedding)]
    sites += [part for m in model.modules() if isinstance(m, Block) for part in (m.attn, m.mlp)]
    return [m.register_forward_hook(drop) for m in sites] if p > 0 else []


def _windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([tokens[s: s + context + 1] for s in starts])
    x = torch.as_tensor(rows[:, :-1])
    return x, torch.as_tensor(rows[:, 1:]).reshape(-1)


@torch.no_grad()
def window_losses(model, tokens: np.ndarray, context: int, device: torch.device, windows: int,
                  batch: int = 64) -> np.ndarray:
    """Mean next-token loss of each of the first `windows` non-overlapping windows of `tokens`."""
    starts = np.arange(0, len(tokens) - context - 1, context)[:windows]
    model.eval()
    losses = []
    for i in range(0, len(starts), batch):
        x, y = _windows(tokens, starts[i: i + batch], context)
        per_token = F.cross_entropy(model(x.to(device)), y.to(device), reduction="none")
        losses.append(per_token.reshape(len(x), context).mean(dim=1).double().cpu().numpy())
    model.train()
    return np.concatenate(losses) if losses else np.zeros(0)


def held_out_loss(model, tokens: np.ndarray, context: int, device: torch.device, windows: int,
                  batch: int = 64) -> float:
    """Mean next-token loss over the first `windows` non-overlapping windows of `tokens` (all of equal length)."""
    losses = window_losses(model, tokens, context, device, windows, batch)
    return float(losses.mean()) if len(losses) else 0.0


def split(tokens: np.ndarray, holdout: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The corpus's training text, then its last `holdout` share's halves: validation text, test text."""
    cut = int(len(tokens) * (1 - holdout))
    held = tokens[cut:]
    return tokens[:cut], held[: len(held) // 2], held[len(held) // 2:]


def pretrain(corpus: Corpus, layers: int, settings: PretrainSettings,
             on_step: Optional[Callable[[int, float], None]] = None,
             start: Optional[tuple[dict, int]] = None,
             checkpoint: Optional[Path] = None) -> tuple[ModelRef, dict, dict]:
    """Train one depth: (its ModelRef, its state dict, a summary of what was measured). `settings.device`
    must be usable (the CLI checks it first). `start` (weights, steps they were trained): continue from them
    (`continuation`); the batches and dropout masks are seeded with those steps too, so a continuation with
    the first run's settings draws other windows than it did, and its starting point is the first validation
    candidate, so the model kept is never one the validation text judges worse than the one it started from.
    `checkpoint`: a file the whole training state is written to every `eval_every` steps (100 without them);
    if it exists, training resumes from it and ends as the uninterrupted run would have."""
    device = torch.device(settings.device)
    train, validation, test = split(corpus.tokens, settings.holdout)
    if len(train) <= settings.context + 1 or len(validation) <= settings.context + 1 or len(test) <= settings.context + 1:
        raise ConfigError(f"--context {settings.context}: the corpus ({len(corpus.tokens)} tokens) is too short for "
                          "windows this long in its training, validation and test parts; use a shorter context")
    ref = model_ref(layers, len(corpus.vocab), settings)
    state, done = start if start is not None else (None, 0)
    torch.manual_seed(settings.seed + done)
    model = build(ref).to(device).train()
    if state is not None:
        model.load_state_dict(state)
    hooks = with_dropout(model, settings.dropout)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng([settings.seed, done] if done else settings.seed)
    losses, curve, best, t0 = [], [], None, time.perf_counter()
    first, earlier_seconds = 0, 0.0
    if checkpoint is not None and Path(checkpoint).exists():
        saved = _read_checkpoint(Path(checkpoint), settings, done)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["numpy_rng"]
        torch.set_rng_state(saved["torch_rng"])
        if device.type == "cuda" and saved["cuda_rng"] is not None:
            torch.cuda.set_rng_state(saved["cuda_rng"], device)
        first, losses, curve, earlier_seconds = saved["step"], saved["losses"], saved["curve"], saved["seconds"]
        best = tuple(saved["best"]) if saved["best"] is not None else None

    def save(step: int) -> None:
        """The state after `step` steps, written whole or not at all (a kill mid-write keeps the last one)."""
        snapshot = {"settings": asdict(settings), "start_steps": done, "step": step, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "numpy_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                    "losses": losses, "curve": curve, "best": list(best) if best is not None else None,
                    "seconds": earlier_seconds + time.perf_counter() - t0}
        Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
        partial = Path(checkpoint).with_suffix(".partial")
        torch.save(snapshot, partial)
        partial.replace(checkpoint)

    def measure(step: int) -> bool:
        """Validation loss at `step`; keeps the checkpoint if it is the best yet. False: stop (patience)."""
        nonlocal best
        loss = held_out_loss(model, validation, settings.context, device, settings.eval_windows)
        curve.append([step, round(loss, 5)])
        if best is None or loss < best[1]:
            best = (step, loss, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        return not settings.patience or (step - best[0]) < settings.patience * settings.eval_every

    if state is not None and settings.eval_every and not first:
        measure(0)
    for step in range(first, settings.steps):
        for group in opt.param_groups:
            group["lr"] = settings.lr_at(step)
        x, y = _windows(train, rng.integers(0, len(train) - settings.context - 1, settings.batch_size), settings.context)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step + 1, losses[-1])
        if settings.eval_every and (step + 1) % settings.eval_every == 0 and not measure(step + 1):
            break
        if checkpoint is not None and (step + 1) % (settings.eval_every or 100) == 0:
            save(step + 1)
    if settings.eval_every and (not curve or curve[-1][0] != len(losses)):
        measure(len(losses))
    seconds = earlier_seconds + time.perf_counter() - t0
    for hook in hooks:
        hook.remove()
    if best is not None:
        model.load_state_dict(best[2])
    tail = losses[-max(1, len(losses) // 10):]
    summary = {"steps": len(losses), "seconds": seconds, "first_loss": losses[0] if losses else None,
               "train_loss": sum(tail) / len(tail) if losses else None,
               "held_out_loss": held_out_loss(model, test, settings.context, device, settings.eval_windows),
               "params": sum(p.numel() for p in model.parameters())}
    if best is not None:
        summary.update(best_step=best[0], validation_loss=best[1], validation_curve=curve)
    return ref, {k: v.detach().to("cpu") for k, v in model.state_dict().items()}, summary


def _read_checkpoint(path: Path, settings: PretrainSettings, start_steps: int) -> dict:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ConfigError(f"{path}: cannot read it ({str(exc).splitlines()[0]}); remove it to start that depth "
                          "again") from None
    # the device may change between parts (a run started on a laptop, finished on a GPU); nothing else may
    ours = {k: v for k, v in asdict(settings).items() if k != "device"}
    theirs = {k: v for k, v in saved.get("settings", {}).items() if k != "device"}
    if theirs != ours or saved.get("start_steps") != start_steps:
        changed = sorted(k for k, v in ours.items() if theirs.get(k) != v)
        raise ConfigError(f"{path}: written by a run with other settings ({', '.join(changed) or '--from'}); "
                          "resume with the settings it was started with, or remove it to start that depth again")
    return saved


def checkpoint_for(root: Path, layers: int) -> Path:
    """Where an unfinished depth keeps its training state (removed once the depth is written)."""
    return folder_for(root, layers) / "checkpoint.pt"


def write(root: Path, ref: ModelRef, state: dict, corpus: Corpus, settings: PretrainSettings, summary: dict) -> Path:
    folder = folder_for(root, ref.args["layers"])
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "weights.pt")
    config = {"schema": SCHEMA, "model": ref.to_json(), "vocab": list(corpus.vocab), "corpus": corpus.name,
              "works": list(corpus.works), "plays": list(corpus.plays), "settings": asdict(settings), **summary}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


STAGE_FIELDS = ("settings", "steps", "best_step", "validation_loss", "held_out_loss", "train_loss", "seconds")


def continuation(root: Path, ref: ModelRef, corpus: Corpus) -> tuple[dict, int, list[dict]]:
    """What continuing `ref` of the set in `root` on `corpus` starts from: (its weights; the steps behind them,
    each stage counting its steps up to the checkpoint it kept; the stages, oldest first, each with its
    settings, steps and measured losses). The corpus must be the one they were trained on: the held-out
    text is the corpus's tail, so on other text the test text could have been trained on."""
    state = load_pretrained(root, ref, "--from")
    config = read_config(folder_for(root, ref.args["layers"]))
    if config["vocab"] != list(corpus.vocab) or config.get("works") != list(corpus.works):
        raise ConfigError(f"--from {root}: layers-{ref.args['layers']} was pretrained on other text "
                          f"({len(config.get('works', []))} works); continue it with the --plays it was pretrained on")
    stages = config.get("stages", []) + [{k: config[k] for k in STAGE_FIELDS if k in config}]
    return state, sum(stage.get("best_step", stage["steps"]) for stage in stages), stages


def depths_to_train(output: Path, depths: list[int], resume: bool) -> tuple[list[int], list[int]]:
    """(the depths to pretrain into `output`, the depths a stopped run already wrote there and `resume` keeps).
    A depth a stopped run left unfinished is refused without `resume`."""
    unfinished = [d for d in depths if checkpoint_for(output, d).exists()]
    if unfinished and not resume:
        raise ConfigError(f"-o {output}: a stopped run left layers {', '.join(map(str, unfinished))} unfinished "
                          "(checkpoint.pt); add --resume to continue it, or choose another folder")
    kept = [d for d in depths if d not in unfinished and (folder_for(output, d) / "config.json").exists()] \
        if resume else []
    return [d for d in depths if d not in kept], kept


def pretrain_set(output: Path, depths: list[int], settings: PretrainSettings, corpus: Corpus,
                 start: Optional[Path] = None,
                 on_step: Callable[[int], Callable[[int, float], None]] = lambda depth: lambda step, loss: None,
                 ) -> Iterator[tuple[int, Path, dict]]:
    """Pretrain each of `depths` on `corpus` and write it into `output` (from random weights, or continuing the
    models of the set `start`), resuming a depth from its checkpoint where a stopped run left one. Yields
    (depth, its folder, its summary) as each is written; `on_step(depth)` is told each step's loss."""
    if start is not None and start.resolve() == output.resolve():
        raise ConfigError(f"--from {start}: the same folder as -o; write the continued set to another folder, so "
                          "the set it starts from stays whole if the run is stopped")
    starts = {depth: continuation(start, model_ref(depth, len(corpus.vocab), settings), corpus)
              for depth in depths} if start is not None else {}
    for depth in depths:
        begun = starts.get(depth)
        ref, state, summary = pretrain(corpus, depth, settings, on_step(depth), begun[:2] if begun else None,
                                       checkpoint_for(output, depth))
        if begun:
            summary.update(stages=begun[2], total_steps=begun[1] + summary.get("best_step", summary["steps"]))
        folder = write(output, ref, state, corpus, settings, summary)
        checkpoint_for(output, depth).unlink(missing_ok=True)
        yield depth, folder, summary
