"""What an emulated and a served run both take: the round loop's seed, learning rate and evaluation period,
and where the test split comes from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(kw_only=True)
class RunOptions:
    seed: int = 0
    lr: float = 0.05                        # decays to a tenth over the rounds (LoopSettings.lr_at)
    eval_every: int = 1                     # rounds between evaluations of the global model (and the last one)
    test_limit: Optional[int] = None        # a seeded subset of the test split (edgefl.data.load_split)
    data_root: Optional[Path] = None        # where the data sets' local copies are
