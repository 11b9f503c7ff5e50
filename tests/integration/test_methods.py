"""The methods' training halves, end to end on a Fashion-MNIST subset (CPU, one thread): FeDepth's block
sequences, DepthFL's self-distillation, FjORD's ordered dropout, ProFL's online step switching, FedOLF's
TOA downloads, measured memory with out-of-memory failures, and per-group accuracy."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from emulation_inputs import CNN, FLEET, small_budget

from edgefl.data import load_dataset, parse_partition
from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice
from edgefl.engines.local import emulate, torch_trainer
from edgefl.fleet import parse_fleet
from edgefl.messages import RoundInstruction
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, get_strategy
from edgefl.planning.strategies.profl import ProFL
from edgefl.server.coordinator import LoopSettings
from edgefl.server.global_model import TorchServerModel
from edgefl.zoo import ModelRef

pytestmark = pytest.mark.usefixtures("one_thread")


def plan_for(strategy, rounds=3):
    fleet = parse_fleet(FLEET.format(small=small_budget()))
    return fleet, verify(strategy.plan(PlanContext(fleet, CNN, rounds=rounds, batch_size=32)), fleet)


def run(strategy, data, rounds=3, per_round=4, **kwargs):
    train, test = data
    fleet, plan = plan_for(strategy, rounds)
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    settings = LoopSettings(rounds=rounds, clients_per_round=per_round, lr=0.05, seed=0,
                            measure_memory=kwargs.pop("measure_memory", False))
    records, server = emulate(fleet, plan, strategy, plan.model, train, test, shares, settings, **kwargs)
    return plan, records, server


def one_device(strategy, group, data, options=None, **trainer_args):
    """A server, a device of `group` holding 100 local examples, and the instruction of its step."""
    train, _ = data
    _, plan = plan_for(strategy)
    step = strategy.configure_round(plan, 1, group)
    opts = strategy.trainer_options(1, step, plan.groups[group]) if options is None else options
    instruction = RoundInstruction(round=1, device_id=f"{group}-0", config=step.config, weights_version=0, seed=7,
                                   lr=0.05, options=tuple(sorted(opts.items())), sequence=step.sequence)
    trainer = torch_trainer(CNN, **trainer_args)
    server = TorchServerModel(CNN, None, trainer, seed=0)
    device = EmulatedDevice(instruction.device_id, trainer, train.x[:100], train.y[:100])
    return server, device, instruction


def test_fedepth_trains_the_sequence_and_aggregates_every_block(data):
    server, device, instruction = one_device(get_strategy("fedepth"), "small", data)
    blocks = instruction.configs
    assert len(blocks) >= 2 and all(a.end == b.frozen_prefix for a, b in zip(blocks, blocks[1:]))
    delivery = server.weights_for(instruction, device_seed=1)
    report = device.handle(instruction, delivery.weights)
    assert report.ok, report.reason
    # every block goes up with its skip classifier (the last with the model's head), nothing else
    expected = {k for c in blocks for k in server.state if any(k.startswith(f"layers.{i}.") for i in c.trained_layers)
                or (c.aux_head is not None and k.startswith(c.aux_prefix))}
    assert set(report.tensors) == expected
    for c in blocks:
        assert any(k.startswith(f"layers.{c.frozen_prefix}.") for k in report.tensors)
        assert c.aux_head is None or any(k.startswith(c.aux_prefix) for k in report.tensors)
    before = {k: v.clone() for k, v in server.state.items()}
    server.aggregate([server.contribution(report, instruction, delivery.handle)], "trained")
    for key in report.tensors:
        assert torch.equal(server.state[key], report.tensors[key]) and not torch.equal(server.state[key], before[key])


def test_fedepth_runs_with_mutual_distillation_on_rich_devices(data):
    plan, records, _ = run(get_strategy("fedepth"), data, rounds=2, per_round=10)
    assert plan.groups["big"].flags == ("mutual-distillation",)
    metrics = records[-1].device_metrics
    assert {m.get("mutual_copies") for d, m in metrics.items() if d.startswith("big")} == {2}
    assert all(records[-1].sampled[d] == "big" for d in metrics)
    assert records[-1].participating == {"small": 6, "big": 4}


def test_depthfl_distillation_changes_the_loss(data):
    strategy = get_strategy("depthfl")
    server, device, instruction = one_device(strategy, "big", data)
    assert instruction.option("exits") == (1, 2) and instruction.option("distill") == 1.0
    delivery = server.weights_for(instruction, device_seed=1)
    with_kl = device.handle(instruction, delivery.weights)
    assert {"aux.1.linear.fc.weight", "aux.2.linear.fc.weight", "layers.3.weight"} <= set(with_kl.tensors)
    plain = dataclasses.replace(instruction, options=(("distill", 0.0), ("exits", (1, 2))))
    without = device.handle(plain, delivery.weights)
    # the same first batch: the KL between the three exits adds to the summed cross-entropies
    assert with_kl.loss_before > without.loss_before + 1e-4
    assert not torch.equal(with_kl.tensors["layers.0.0.weight"], without.tensors["layers.0.0.weight"])
    server.aggregate([server.contribution(with_kl, instruction, delivery.handle)], "trained")
    assert torch.equal(server.state["aux.1.linear.fc.weight"], with_kl.tensors["aux.1.linear.fc.weight"])


def test_fjord_trains_a_sampled_width_per_batch(data):
    plan, records, _ = run(get_strategy("fjord"), data, rounds=2, per_round=10)
    s_small = plan.groups["small"].steps[0].config.head_width
    for r in records:
        for device, metrics in r.device_metrics.items():
            widths = {float(p): n for p, n in metrics["fjord_widths"].items()}
            cap = s_small if r.sampled[device] == "small" else 1.0
            assert len(widths) >= 2 and max(widths) <= cap and sum(widths.values()) == 4   # 120 examples / 32
    assert records[-1].participating == {"small": 6, "big": 4}


def test_fjord_narrow_batches_touch_only_the_prefix(data):
    strategy = get_strategy("fjord")
    server, device, instruction = one_device(strategy, "small", data, options={"fjord_widths": (0.25,)},
                                             momentum=0.0, weight_decay=0.0)
    delivery = server.weights_for(instruction, device_seed=1)
    report = device.handle(instruction, delivery.weights)
    assert report.metrics == {"fjord_widths": {"0.25": 4}}                  # 100 examples, batches of 32
    w0, w1 = delivery.weights["layers.0.0.weight"], report.tensors["layers.0.0.weight"]
    assert w1.shape == w0.shape                                   # the upload is the s_e submodel
    assert not torch.equal(w1[:8], w0[:8]) and torch.equal(w1[8:], w0[8:])   # floor(0.25 * 32) = 8 filters
    f0, f1 = delivery.weights["layers.2.1.weight"], report.tensors["layers.2.1.weight"]
    assert torch.equal(f1[128:], f0[128:]) and torch.equal(f1[:, 16 * 49:], f0[:, 16 * 49:])


def test_profl_switches_steps_when_effective_movement_flattens(data):
    strategy = ProFL(H=1, W=1, phi=1e-3, window=2)   # EM over one round is 1: its slope is flat at once
    plan, records, _ = run(strategy, data, rounds=6, per_round=10)
    steps = [r.decisions["step"] for r in records]
    assert steps == sorted(steps) and steps[-1] >= 1
    switches = [r for r in records if "switched_to" in r.decisions]
    assert switches and all("effective_movement" in r.decisions for r in records[1:])
    assert all(r.decisions["slope"] < 1e-3 for r in switches)
    # the round after a switch trains the next step's configs, whatever the plan's round ranges say
    after = records[switches[0].round]
    assert after.decisions["step"] == switches[0].decisions["switched_to"]
    big = {s.rounds: s for s in plan.groups["big"].steps}[strategy.order(plan)[after.decisions["step"]]]
    assert {p for d, p in after.predicted_peak_bytes.items() if after.sampled[d] == "big"} == {
        big.predicted.peak_memory_bytes}

    never = ProFL(H=1, W=1, phi=-1.0, window=2)
    _, records, _ = run(never, data, rounds=3, per_round=3)
    assert [r.decisions["step"] for r in records] == [0, 0, 0]


def test_profl_is_judged_by_the_model_its_current_step_trains(data):
    """Mid-schedule ProFL's whole model is no model (later blocks trained on features since replaced): each
    evaluation judges the current step's blocks with their output module, and the whole model once a step
    ends in the classifier."""
    strategy = ProFL(H=1, W=1, phi=1e-3, window=2)          # switches every second round from round 3
    plan, records, server = run(strategy, data, rounds=5, per_round=10)
    assert records[-1].decisions["switched_to"] == records[-1].decisions["step"] + 1     # the last round switched
    order = strategy.order(plan)
    ends = []
    trained = strategy.last_trained
    assert trained == records[-1].decisions["step"]          # the step the last round trained, switch or not
    judged_now = strategy.evaluated_config(plan)
    for i in range(len(order)):
        strategy.last_trained = i
        judged = strategy.evaluated_config(plan)
        configs = [s.config for g in plan.groups.values() for s in g.steps if s.rounds == order[i]]
        if any(c.end == c.num_layers for c in configs):
            assert judged is None
        else:
            assert judged.aux_head == "conv" and judged.end == max(c.end for c in configs) < judged.num_layers
        ends.append(None if judged is None else judged.end)
    assert ends[0] is None and ends[-1] is None and any(ends)       # shrinking starts, growing ends, in the classifier
    strategy.last_trained = trained
    judged = strategy.evaluated_config(plan)
    assert judged == judged_now and judged is not None, "the run should end mid-schedule"
    model = server.global_model()
    assert len(model.layers) == judged.end and hasattr(model, "aux")
    assert records[-1].accuracy == pytest.approx(server.evaluate()["accuracy"])


def test_toa_reports_a_download_saving_and_still_trains(data):
    plan, records, server = run(get_strategy("fedolf"), data, rounds=4, per_round=10, toa=0.5)
    _, plain, _ = run(get_strategy("fedolf"), data, rounds=1, per_round=10)
    assert plan.groups["small"].steps[0].config.frozen_prefix >= 2
    assert all(r.download_saved_bytes > 0 for r in records)
    assert records[0].download_bytes + records[0].download_saved_bytes == plain[0].download_bytes
    assert all(not r.rejected and not r.failed and r.participating == {"small": 6, "big": 4} for r in records)
    assert records[-1].accuracy > records[0].accuracy + 0.1


def test_measured_memory_matches_the_cost_model_and_an_overfull_device_fails(data):
    plan, records, _ = run(get_strategy("fedolf"), data, rounds=1, per_round=10, measure_memory=True)
    r = records[0]
    assert set(r.measured_activation_bytes) == set(r.sampled) and not r.failed
    for device, measured in r.measured_activation_bytes.items():
        predicted = plan.groups[r.sampled[device]].steps[0].predicted
        assert measured == pytest.approx(predicted.activation_bytes, rel=0.05)
    # a device whose real memory is one byte short of its true peak fails like an OOM; the run goes on
    victim = "big-0"
    predicted = plan.groups["big"].steps[0].predicted
    true_peak = predicted.peak_memory_bytes - predicted.activation_bytes + r.measured_activation_bytes[victim]
    _, records, _ = run(get_strategy("fedolf"), data, rounds=2, per_round=10, measure_memory=True,
                        device_memory={victim: true_peak - 1})
    for r in records:
        assert set(r.failed) == {victim} and "out of memory" in r.failed[victim]
        assert r.participating == {"small": 6, "big": 3} and r.accuracy is not None
        assert set(r.group_accuracy) == {"small", "big"} and all(0 <= a <= 1 for a in r.group_accuracy.values())


def test_cli_toa_and_measure_memory(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.format(small=small_budget()))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "fedolf", "--rounds", "1", "--clients-per-round",
                        "10", "--train-limit", "600", "--test-limit", "200", "--toa", "0.5", "--measure-memory",
                        "-o", str(out)], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    (record,) = json.loads((out / "history.json").read_text())["rounds"]
    assert record["download_saved_bytes"] > 0 and len(record["measured_activation_bytes"]) == 10
    assert set(record["group_accuracy"]) == {"small", "big"} and record["failed"] == {}


# ---- Heterogeneous LoRA and FedHM on a tiny transformer LM (Shakespeare next character) ----------------

LM = ModelRef.of("transformer", layers=2, embed=24, heads=2, context=16, vocab=82)


@pytest.fixture(scope="module")
def text():
    """A seeded Shakespeare subset in 16-character windows: 720 training and 200 test windows."""
    def subset(ds, n, seed):
        keep = np.sort(np.random.default_rng(seed).permutation(len(ds.y))[:n])
        return dataclasses.replace(ds, x=np.ascontiguousarray(ds.x[keep]), y=ds.y[keep], groups=ds.groups[keep])
    return (subset(load_dataset("shakespeare", split="train", seq_len=16), 720, 0),
            subset(load_dataset("shakespeare", split="test", seq_len=16), 200, 1))


def lm_run(strategy, text, mode):
    """Two groups of three: 'lo' with an upload budget between ranks 2 and 3, 'hi' with none; 3 rounds,
    every device every round, activations measured."""
    probe = PlanContext(parse_fleet("fleet: {groups: {x: {count: 1, memory_budget: 4GiB}}}"), LM, batch_size=16)
    up = [probe.cost(probe.config(frozen_prefix=1, rank=r, rank_mode=mode), "torch").upload_bytes for r in (2, 3)]
    fleet = parse_fleet("fleet:\n  groups:\n"
                        f"    lo: {{count: 3, memory_budget: 4GiB, upload_budget: {sum(up) // 2}, runtime: torch}}\n"
                        "    hi: {count: 3, memory_budget: 4GiB, runtime: torch}\n")
    plan = verify(strategy.plan(PlanContext(fleet, LM, rounds=3, batch_size=16)), fleet)
    train, test = text
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    settings = LoopSettings(rounds=3, clients_per_round=6, lr=0.05, seed=0, measure_memory=True)
    records, server = emulate(fleet, plan, strategy, plan.model, train, test, shares, settings)
    for r in records:
        assert not r.failed and not r.rejected and r.participating == {"lo": 3, "hi": 3}, (r.failed, r.rejected)
        assert 0 <= r.accuracy <= 1 and np.isfinite(r.train_loss)
        for device, kept in r.measured_activation_bytes.items():
            assert kept == plan.groups[r.sampled[device]].steps[0].predicted.activation_bytes
    # the upload the plan predicted, less the blocks' causal masks (buffers it counts, never in a state dict)
    masks = 2 * 16 * 16 * 4
    assert records[0].upload_bytes == sum(3 * (g.steps[0].predicted.upload_bytes - masks) for g in plan.groups.values())
    return plan, records, server


def test_heterogeneous_lora_trains_the_transformer_at_two_ranks(text):
    from edgefl.planning.strategies.lora import HeterogeneousLoRA
    from edgefl.server.lowrank import lora_key

    plan, records, server = lm_run(HeterogeneousLoRA(max_rank=8), text, "lora")
    assert {g: p.steps[0].config.rank for g, p in plan.groups.items()} == {"lo": 2, "hi": 8}
    q = "layers.1.attn.q"
    a, b, base = (server.state[lora_key(q, part)] for part in ("A", "B", "base"))
    assert a.shape == (8, 24) and b.shape == (24, 8)
    assert torch.count_nonzero(b[:, :2]) and torch.count_nonzero(b[:, 2:])   # every rank component trained
    assert torch.allclose(server.state[f"{q}.weight"], base + b @ a, atol=1e-6)
    # the embedding and the blocks' base weights never move; the output layer does
    fresh = TorchServerModel(LM, None, torch_trainer(LM), seed=0).state
    assert torch.equal(server.state["layers.0.tok.weight"], fresh["layers.0.tok.weight"])
    assert torch.equal(base, fresh[f"{q}.weight"])
    assert not torch.equal(server.state["layers.3.fc.weight"], fresh["layers.3.fc.weight"])


def test_fedhm_trains_factors_where_full_rank_does_not_fit(text):
    from edgefl.planning.strategies.fedhm import FedHM

    plan, records, server = lm_run(FedHM(max_rank=8), text, "factor")
    assert {g: p.steps[0].config.rank for g, p in plan.groups.items()} == {"lo": 2, "hi": None}
    assert not any(k.startswith("aux.") for k in server.state)        # full matrices are what the server keeps
    fresh = TorchServerModel(LM, None, torch_trainer(LM), seed=0).state
    assert set(server.state) == set(fresh)
    assert not torch.equal(server.state["layers.1.mlp.0.weight"], fresh["layers.1.mlp.0.weight"])


def test_pretrain_then_emulate_lora_from_the_pretrained_set(tmp_path):
    from edgefl.server.lowrank import lora_key

    pre = tmp_path / "pretrained"
    r = subprocess.run([sys.executable, "-m", "edgefl", "pretrain", "-o", str(pre), "--layers", "1,2", "--steps", "2",
                        "--batch-size", "4", "--embed", "16", "--heads", "2", "--dropout", "0.05"],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    for depth in (1, 2):
        config = json.loads((pre / f"layers-{depth}" / "config.json").read_text())
        assert config["schema"] == "edgefl.pretrained/1" and config["model"]["kwargs"]["layers"] == depth
        assert config["steps"] == 2 and len(config["vocab"]) == 82 and config["corpus"] == "shakespeare-pretrain"
        assert 0 < config["held_out_loss"] < 10 and config["seconds"] > 0 and config["settings"]["dropout"] == 0.05
    weights = torch.load(pre / "layers-2" / "weights.pt")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("fleet:\n  groups:\n    a: {count: 2, memory_budget: 4GiB, runtime: torch}\n")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "transformer",
                        "--dataset", "shakespeare", "--method", "lora", "--pretrained", str(pre), "--rounds", "2",
                        "--clients-per-round", "2", "--train-limit", "300", "--test-limit", "100", "-o", str(out)],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "plan.json").read_text())["model"]["kwargs"]["layers"] == 2      # the deepest
    assert [x["round"] for x in json.loads((out / "history.json").read_text())["rounds"]] == [1, 2]
    state = torch.load(out / "weights.pt")
    for q in ("layers.1.attn.q", "layers.2.mlp.2"):
        assert torch.equal(state[lora_key(q, "base")], weights[f"{q}.weight"])    # started from the pretrained model
    assert torch.equal(state["layers.0.tok.weight"], weights["layers.0.tok.weight"])

    r = subprocess.run([sys.executable, "-m", "edgefl", "emulate", "--devices", str(fleet), "--model", "cnn",
                        "--dataset", "fashion-mnist", "--method", "lora", "--pretrained", str(pre), "--rounds", "1",
                        "-o", str(tmp_path / "bad")], capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 2 and "--pretrained" in r.stderr and "Traceback" not in r.stderr


def test_pretrain_keeps_the_best_validation_checkpoint_and_stops_on_patience():
    """A learning rate this high diverges within a few measurements: the model kept is the one at the lowest
    validation loss, training stops `patience` measurements after it, and the reported loss is measured on
    the test half, which the choice never saw."""
    from edgefl.data import pretrain_corpus
    from edgefl.zoo.pretrain import PretrainSettings, held_out_loss, pretrain

    corpus = pretrain_corpus()
    settings = PretrainSettings(steps=200, batch_size=4, embed=16, heads=2, lr=2.0, eval_every=5, patience=2,
                                eval_windows=16)
    ref, state, summary = pretrain(corpus, 1, settings)
    curve = summary["validation_curve"]
    steps = [s for s, _ in curve]
    assert steps == list(range(5, summary["steps"] + 1, 5)) and summary["steps"] < 200
    best_step, best_loss = min(curve, key=lambda c: c[1])
    assert summary["best_step"] == best_step and summary["steps"] == best_step + 2 * 5
    assert summary["validation_loss"] == pytest.approx(best_loss, abs=1e-5) and best_loss < curve[-1][1]
    from edgefl.zoo import build

    model = build(ref)
    model.load_state_dict(state)
    held = corpus.tokens[int(len(corpus.tokens) * (1 - settings.holdout)):]
    validation, test = held[: len(held) // 2], held[len(held) // 2:]
    device = torch.device("cpu")
    assert held_out_loss(model, validation, 80, device, 16) == pytest.approx(best_loss, abs=1e-4)
    assert held_out_loss(model, test, 80, device, 16) == pytest.approx(summary["held_out_loss"], rel=1e-6)


def test_pretraining_continues_a_set_from_its_weights_and_records_the_stages(tmp_path):
    """`--from SET` starts each depth from SET's weights: its first validation measurement (step 0) is the
    loss SET's checkpoint was kept at, its batches are not the first run's, the config lists SET's run as a
    stage and counts the steps behind the weights kept; a set of other text, a depth SET lacks, or -o = SET
    are one-line errors that write nothing."""
    def pretrain_cli(out, *extra):
        return subprocess.run([sys.executable, "-m", "edgefl", "pretrain", "-o", str(out), "--layers", "1,2",
                               "--steps", "10", "--batch-size", "4", "--embed", "16", "--heads", "2",
                               "--eval-every", "5", *extra], capture_output=True, text=True, timeout=300, env=os.environ)

    first, second = tmp_path / "first", tmp_path / "second"
    assert pretrain_cli(first).returncode == 0
    r = pretrain_cli(second, "--from", str(first))
    assert r.returncode == 0, r.stderr
    for depth in (1, 2):
        before = json.loads((first / f"layers-{depth}" / "config.json").read_text())
        after = json.loads((second / f"layers-{depth}" / "config.json").read_text())
        assert after["validation_curve"][0] == [0, round(before["validation_loss"], 5)]
        assert [c[0] for c in after["validation_curve"]] == [0, 5, 10]
        assert after["stages"] == [{k: before[k] for k in ("settings", "steps", "best_step", "validation_loss",
                                                           "held_out_loss", "train_loss", "seconds")}]
        assert after["total_steps"] == before["best_step"] + after["best_step"]
        assert after["validation_loss"] <= before["validation_loss"]
    from edgefl.data import pretrain_corpus
    from edgefl.errors import ConfigError
    from edgefl.zoo.pretrain import PretrainSettings, continuation, model_ref, pretrain

    corpus, sizes = pretrain_corpus(), PretrainSettings(steps=2, batch_size=4, embed=16, heads=2, eval_windows=2)
    state, steps, stages = continuation(second, model_ref(2, 82, sizes), corpus)      # a third part's start
    assert [s["steps"] for s in stages] == [10, 10] and steps == after["total_steps"]

    def first_batch_loss(done):
        losses = []
        pretrain(corpus, 2, sizes, lambda step, loss: losses.append(loss), (state, done))
        return losses[0]
    # the same weights and seed: the windows drawn depend on the steps already trained, so a part run with the
    # settings of the part before it does not replay that part's batches
    assert first_batch_loss(steps) == first_batch_loss(steps) != first_batch_loss(0)
    for layers, settings, message in ((3, sizes, "no 3-layer model"),
                                      (1, PretrainSettings(embed=32, heads=2), "layers-1 holds transformer(")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            continuation(first, model_ref(layers, 82, settings), corpus)
    bad = tmp_path / "bad"
    r = pretrain_cli(bad, "--from", str(first), "--plays", "hamlet")
    assert r.returncode == 2 and "layers-1 was pretrained on other text" in r.stderr and "Traceback" not in r.stderr
    assert not bad.exists()
    r = pretrain_cli(first, "--from", str(first))
    assert r.returncode == 2 and "the same folder as -o" in r.stderr


def test_a_stopped_pretraining_resumes_and_ends_as_the_uninterrupted_run(tmp_path):
    """A depth stopped mid-schedule (here by an exception at step 17, after the checkpoint of step 15) and
    resumed from its checkpoint ends with the very weights, validation curve and losses of the run that was
    never stopped (AdamW's moments, the windows drawn and dropout's masks all continue); the CLI refuses a
    folder with an unfinished depth unless --resume, finishes it with --resume and removes its checkpoint,
    and refuses a checkpoint written with other settings, naming them."""
    from edgefl.data import pretrain_corpus
    from edgefl.errors import EdgeflError
    from edgefl.zoo.pretrain import PretrainSettings, checkpoint_for, pretrain
    from edgefl.zoo.pretrained import available

    corpus = pretrain_corpus()
    settings = PretrainSettings(steps=30, batch_size=4, embed=16, heads=2, eval_every=5, dropout=0.1)
    _, whole, whole_summary = pretrain(corpus, 1, settings, checkpoint=tmp_path / "whole.pt")

    def stop_at_17(step, loss):
        if step == 17:
            raise KeyboardInterrupt
    stopped = tmp_path / "set"
    with pytest.raises(KeyboardInterrupt):
        pretrain(corpus, 1, settings, stop_at_17, checkpoint=checkpoint_for(stopped, 1))
    assert torch.load(checkpoint_for(stopped, 1), weights_only=True)["step"] == 15
    with pytest.raises(EdgeflError, match="unfinished"):
        available(stopped)

    _, resumed, resumed_summary = pretrain(corpus, 1, settings, checkpoint=checkpoint_for(stopped, 1))
    assert set(resumed) == set(whole) and all(torch.equal(resumed[k], whole[k]) for k in whole)
    for key in ("steps", "best_step", "validation_loss", "validation_curve", "train_loss", "first_loss", "held_out_loss"):
        assert resumed_summary[key] == whole_summary[key], key

    def pretrain_cli(*extra):
        return subprocess.run([sys.executable, "-m", "edgefl", "pretrain", "-o", str(stopped), "--layers", "1,2",
                               "--steps", "30", "--batch-size", "4", "--embed", "16", "--heads", "2",
                               "--eval-every", "5", "--dropout", "0.1", *extra],
                              capture_output=True, text=True, timeout=300, env=os.environ)
    r = pretrain_cli()
    assert r.returncode == 2 and "layers 1 unfinished" in r.stderr and "--resume" in r.stderr
    assert "Traceback" not in r.stderr and checkpoint_for(stopped, 1).exists()
    r = pretrain_cli("--resume", "--lr", "1e-3")
    assert r.returncode == 2 and "other settings (lr)" in r.stderr and "Traceback" not in r.stderr
    r = pretrain_cli("--resume")
    assert r.returncode == 0, r.stderr
    assert not checkpoint_for(stopped, 1).exists() and not checkpoint_for(stopped, 2).exists()
    configs = available(stopped)
    assert configs[1]["validation_curve"] == whole_summary["validation_curve"] and configs[2]["steps"] == 30
    written = torch.load(stopped / "layers-1" / "weights.pt", weights_only=True)
    assert all(torch.equal(written[k], whole[k]) for k in whole)
    r = pretrain_cli("--resume")
    assert r.returncode == 0 and "1 layers: already written" in r.stdout and "2 layers: already written" in r.stdout


def test_a_run_fine_tuning_a_pretrained_set_keeps_its_plays_out_of_the_clients(tmp_path):
    """The clients of a run that fine-tunes a set hold none of the plays the set was pretrained on (so no
    client's text and no test window was pretrained on), whichever plays those were; a set written before
    configs listed their plays was pretrained on the default ones."""
    from edgefl.data import load_dataset, pretrain_corpus
    from edgefl.data.text import PRETRAIN_PLAYS
    from edgefl.zoo.pretrain import PretrainSettings, pretrain, write
    from edgefl.zoo.pretrained import fine_tuning_data_options, pretrained_plays

    settings = PretrainSettings(steps=1, batch_size=2, embed=16, heads=2, eval_windows=2)
    corpus = pretrain_corpus(holdout=["hamlet", "pericles"])
    write(tmp_path / "mine", *pretrain(corpus, 1, settings)[:2], corpus, settings, {})
    assert pretrained_plays(tmp_path / "mine") == ["hamlet", "pericles"]
    options = fine_tuning_data_options(tmp_path / "mine", "shakespeare")
    for split in ("train", "test"):
        plays = {name.split("/")[0] for name in load_dataset("shakespeare", split=split, **options).group_names}
        assert not plays & {"hamlet", "pericles"} and "henry_viii" in plays    # not pretrained on: a client's
    assert fine_tuning_data_options(tmp_path / "mine", "fashion-mnist") == {}

    corpus = pretrain_corpus()
    write(tmp_path / "old", *pretrain(corpus, 1, settings)[:2], corpus, settings, {})
    config_path = tmp_path / "old" / "layers-1" / "config.json"
    config = json.loads(config_path.read_text())
    assert config["plays"] == sorted(PRETRAIN_PLAYS)
    del config["plays"]
    config_path.write_text(json.dumps(config))
    assert pretrained_plays(tmp_path / "old") == sorted(PRETRAIN_PLAYS)

    r = subprocess.run([sys.executable, "-m", "edgefl", "pretrain", "-o", str(tmp_path / "bad"), "--plays", "hamlet,hamlett"],
                       capture_output=True, text=True, timeout=300, env=os.environ)
    assert r.returncode == 2 and "--plays: no play named hamlett" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad").exists()


def test_pretraining_dropout_changes_training_but_not_the_model_that_is_saved():
    """Dropout is a pretraining regulariser only: in training mode it makes two passes differ, in evaluation
    mode (and once removed) the model computes what it computes without it, and the saved state dict has
    the keys of a model built without it, so fine-tuning and export see no dropout."""
    from edgefl.zoo import build
    from edgefl.zoo.pretrain import PretrainSettings, model_ref, with_dropout

    torch.manual_seed(0)
    ref = model_ref(2, 82, PretrainSettings(embed=16, heads=2))
    model = build(ref)
    x = torch.randint(0, 82, (2, 80))
    plain = model.eval()(x)
    hooks = with_dropout(model, 0.3)
    assert len(hooks) == 1 + 2 * 2                      # the embedding, then attention and MLP per block
    model.train()
    a, b = model(x), model(x)
    assert not torch.equal(a, b)
    assert torch.equal(model.eval()(x), plain)
    assert set(model.state_dict()) == set(build(ref).state_dict())
    for hook in hooks:
        hook.remove()
    assert torch.equal(model.train()(x), model(x))
    assert with_dropout(model, 0.0) == []


def test_the_small_model_is_evaluated_as_the_small_model(data):
    """Every device trains the same width-s slice; the global tensors' other entries never leave their
    initialisation, so the model evaluated (and its accuracy in the history) is the width-s one."""
    strategy = get_strategy("small")
    plan, records, server = run(strategy, data, rounds=2)
    common = strategy.evaluated_config(plan)
    assert common is not None and common.head_width < 1
    small = server.global_model()

    first_conv = small.layers[0][0]
    assert first_conv.out_channels == int(32 * common.head_width)       # the CNN's first conv has 32 filters
    assert records[-1].accuracy == pytest.approx(server.evaluate()["accuracy"])
    whole = TorchServerModel(CNN, data[1], server.trainer, seed=0)
    whole.state = server.state
    assert whole.global_model().layers[0][0].out_channels == 32
    assert whole.evaluate()["accuracy"] != records[-1].accuracy     # what the old evaluation measured


def test_methods_that_train_the_whole_model_are_evaluated_whole():
    fleet, plan = plan_for(get_strategy("fedavg"))
    assert get_strategy("fedavg").evaluated_config(plan) is None


def test_depthfl_without_a_full_depth_device_is_evaluated_at_its_deepest_exit(data):
    """No device reaches the last layers: the full model's classifier would stay at its initial weights
    (chance accuracy), so DepthFL is judged by the deepest exit its devices train."""
    train, test = data
    fleet = parse_fleet(f"fleet:\n  groups:\n    small: {{count: 6, memory_budget: {small_budget()}, runtime: ort}}\n")
    strategy = get_strategy("depthfl")
    plan = verify(strategy.plan(PlanContext(fleet, CNN, rounds=2, batch_size=32)), fleet)
    deepest = strategy.evaluated_config(plan)
    assert deepest is not None and deepest.end < deepest.num_layers and deepest.aux_head is not None
    assert deepest.end == max(s.config.end for s in plan.groups["small"].steps)
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    records, server = emulate(fleet, plan, strategy, plan.model, train, test, shares,
                              LoopSettings(rounds=2, clients_per_round=3, lr=0.05, seed=0))
    judged = server.global_model()
    assert len(judged.layers) == deepest.end and hasattr(judged, "aux")
    assert records[-1].accuracy == pytest.approx(server.evaluate()["accuracy"])
    _, full = plan_for(strategy)            # a fleet with a device that holds the whole model: judged whole
    assert strategy.evaluated_config(full) is None


def test_heterofl_is_evaluated_with_static_bn_statistics_of_the_devices_data(data):
    """HeteroFL's sBN: the global model's BN statistics are the cumulative mean of its own batch statistics on
    a sample of the devices' data, written into the global state, not the average of the running statistics
    devices gathered through narrower models."""
    resnet = ModelRef.of("resnet20", num_classes=10, input_shape=(1, 28, 28))
    probe = PlanContext(parse_fleet("fleet:\n  groups:\n    p: {count: 1, memory_budget: 1GiB}\n"), resnet,
                        batch_size=32)
    half = probe.cost(probe.config(head_start=0, head_width=0.5), "ort").peak_memory_bytes
    fleet = parse_fleet(f"fleet:\n  groups:\n    narrow: {{count: 2, memory_budget: {half}, runtime: ort}}\n"
                        "    wide: {count: 2, memory_budget: 1GiB, runtime: torch}\n")
    train, test = data
    shares = parse_partition("iid").split(train.y, 4, 0)
    settings = LoopSettings(rounds=2, clients_per_round=4, lr=0.05, seed=0)

    def run_with(strategy):
        plan = verify(strategy.plan(PlanContext(fleet, resnet, rounds=2, batch_size=32)), fleet)
        assert 0 < plan.groups["narrow"].steps[0].config.head_width < 1
        return emulate(fleet, plan, strategy, plan.model, train, test, shares, settings)

    strategy = get_strategy("heterofl")
    assert strategy.static_bn and not get_strategy("fedavg").static_bn and not get_strategy("fjord").static_bn
    records, server = run_with(strategy)
    x, batch = server.static_bn
    assert len(x) == len(train.y) and batch == 32          # every example when the fleet holds under 2,048

    by_hand = server.global_model()
    norms = [m for m in by_hand.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    by_hand.train()
    with torch.no_grad():
        for start in range(0, len(x), batch):
            by_hand(torch.as_tensor(x[start:start + batch]))
    estimated = {k: v for k, v in by_hand.state_dict().items() if "running_" in k}
    for k, v in estimated.items():
        assert torch.allclose(server.state[k], v, atol=1e-5), k
    assert records[-1].accuracy == pytest.approx(server.evaluate()["accuracy"])

    class Averaged(type(strategy)):
        static_bn = False
    _, averaged = run_with(Averaged())
    # the same training, bit for bit; only the statistics the model is evaluated with differ
    assert all(torch.equal(averaged.state[k], server.state[k]) for k in server.state
               if "running_" not in k and "num_batches" not in k)
    assert any(not torch.allclose(averaged.state[k], v, atol=1e-3) for k, v in estimated.items())
