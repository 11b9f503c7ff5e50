"""The desktop emulation on CUDA (`edgefl emulate --device cuda`) against the same run on the CPU.

Marked `cuda`: deselected by default (CI has no GPU); run them on a machine with one:
    python -m pytest -m cuda tests/integration/test_cuda_emulation.py
The CUDA run must make the same decisions as the CPU run (devices sampled, configs, predicted peaks, FLOPs),
and land on nearly the same model: cuDNN's TF32 convolutions and reduction order differ from the CPU's
float32, so weights agree to a relative tolerance, not bit for bit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from edgefl.data import parse_partition
from edgefl.engines.local import emulate
from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import STRATEGIES, PlanContext, get_strategy
from edgefl.server.coordinator import LoopSettings
from edgefl.zoo import ModelRef

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("one_thread")]

ROUNDS = 2
# after two rounds of SGD at lr 0.05 from one seed: the global weights' relative L2 distance, CUDA vs CPU
WEIGHTS_RTOL = 2e-2
ACCURACY_ATOL = 0.05


def run(method, data, fleet_text, device):
    train, test = data
    fleet = parse_fleet(fleet_text)
    strategy = get_strategy(method)
    plan = verify(strategy.plan(PlanContext(fleet, ModelRef.of("cnn"), rounds=ROUNDS, batch_size=32)), fleet)
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    records, server = emulate(fleet, plan, strategy, plan.model, train, test, shares,
                              LoopSettings(rounds=ROUNDS, clients_per_round=4, lr=0.05, seed=0), device=device)
    return records, server.snapshot()


def decisions(record) -> tuple:
    return (record.sampled, record.participating, record.skipped, record.failed, record.predicted_peak_bytes,
            record.examples, record.flops_per_device, record.upload_bytes, record.download_bytes)


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_method_trains_on_cuda_as_on_the_cpu(method, data, fleet_text):
    torch.cuda.reset_peak_memory_stats()
    cuda_records, cuda_state = run(method, data, fleet_text, "cuda")
    assert torch.cuda.max_memory_allocated() > 0, "the run never touched the GPU"
    cpu_records, cpu_state = run(method, data, fleet_text, "cpu")

    assert [decisions(r) for r in cuda_records] == [decisions(r) for r in cpu_records]
    for cuda, cpu in zip(cuda_records, cpu_records):
        assert abs(cuda.accuracy - cpu.accuracy) <= ACCURACY_ATOL, (cuda.accuracy, cpu.accuracy)
    assert cuda_state.keys() == cpu_state.keys()
    num = sum(float(np.sum((cuda_state[k].astype(np.float64) - cpu_state[k]) ** 2)) for k in cpu_state)
    den = sum(float(np.sum(cpu_state[k].astype(np.float64) ** 2)) for k in cpu_state)
    assert np.sqrt(num / den) <= WEIGHTS_RTOL, f"{method}: relative distance {np.sqrt(num / den):.2e}"


def test_a_model_built_on_the_cpu_is_evaluated_on_the_gpu():
    """bench/reproduce_caff.py evaluates each pretrained depth it builds on the CPU with a CUDA trainer."""
    from edgefl.engines.local import torch_trainer
    from edgefl.trainconfig import TrainConfig
    from edgefl.zoo import build

    ref = ModelRef.of("transformer", layers=2, vocab=20, context=8, embed=16, heads=2)
    model = build(ref)
    x = np.random.default_rng(0).integers(0, 20, size=(64, 8))
    y = np.random.default_rng(1).integers(0, 20, size=64)
    config = TrainConfig(num_layers=len(model.layers))
    on_cpu = torch_trainer(ref, "cpu").evaluate(model, config, x, y)
    on_gpu = torch_trainer(ref, "cuda").evaluate(model, config, x, y)
    assert next(model.parameters()).is_cuda
    assert on_gpu["accuracy"] == pytest.approx(on_cpu["accuracy"], abs=2 / 512)
    assert on_gpu["loss"] == pytest.approx(on_cpu["loss"], rel=1e-4)


def test_cli_emulates_on_cuda(tmp_path, fleet_text):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_text)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "fedolf", "--rounds", "2", "--clients-per-round", "3",
                        "--train-limit", "600", "--test-limit", "300", "--device", "cuda", "-o", str(out)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    rounds = json.loads((out / "history.json").read_text())["rounds"]
    assert [x["round"] for x in rounds] == [1, 2]
    assert all(0 <= x["accuracy"] <= 1 for x in rounds)


def test_pretrain_and_fine_tune_on_cuda(tmp_path):
    """CAFF's path: pretrain a set on the GPU, then fine-tune it there (the transformer, AdamW, token data)."""
    pre = tmp_path / "pre"
    r = subprocess.run([sys.executable, "-m", "edgefl", "pretrain", "-o", str(pre), "--layers", "1,2", "--steps", "4",
                        "--batch-size", "4", "--embed", "16", "--heads", "2", "--device", "cuda"], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in pre.iterdir()} >= {"layers-1", "layers-2"}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("fleet:\n  groups:\n    phones: {count: 4, memory_budget: 1GiB, runtime: torch}\n")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "transformer",
                        "--dataset", "shakespeare", "--method", "caff", "--pretrained", str(pre), "--rounds", "2",
                        "--clients-per-round", "2", "--train-limit", "400", "--test-limit", "200", "--device", "cuda",
                        "-o", str(out)], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    rounds = json.loads((out / "history.json").read_text())["rounds"]
    assert [x["round"] for x in rounds] == [1, 2] and all(0 <= x["accuracy"] <= 1 for x in rounds)
