"""What crosses Flower's wire for edgefl: a RoundInstruction and its tensors as a train Message's records, a
DeviceReport as the reply's.

A train message holds two records: `arrays`, an ArrayRecord with exactly the tensors the server's
`weights_for` extracts for that device (its width slice, its trained layers and the frozen prefix its
forward pass runs through: what `edgefl emulate` hands the same device, byte for byte), and `config`, a
ConfigRecord with the instruction (its group's TrainConfig, round, seed, learning rate, trainer options)
as edgefl's own JSON, the config's fields again as plain keys a Flower user can read, and what the node
needs to train it (the model, the torch thread count, its memory). A reply holds the trained tensors
(`arrays`), a MetricRecord a Flower strategy can average (`metrics`: loss, examples, bytes, peak RSS) and
the whole report as JSON (`report`). Tensors cross as numpy arrays, float32 kept bit for bit.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from edgefl.errors import require
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.protocol.tensors import as_array

FLWR = "flwr"       # the module, and the extra that installs it: edgefl[flower]
# torch intra-op threads a node trains with, the CPUs Flower's simulation reserves for each client (its Ray
# actors run with OMP_NUM_THREADS set to them): more threads than reserved CPUs oversubscribe the machine (2
# actors of 2 threads on 2 cores: 20 rounds of bench/flower_bridge.py took 364 s, at one thread 132 s). One count for
# every node: parallel float sums depend on it, so the same run gives the same weights wherever it trains.
NODE_THREADS = 1


def import_flwr():
    """The flwr.app module (Message, records), or the one-line install hint."""
    require(FLWR, "flower")
    import flwr.app

    return flwr.app


def array_record(tensors: Mapping[str, Any]):
    """An ArrayRecord of `tensors` (torch or numpy) under their global names, in their order."""
    app = import_flwr()
    return app.ArrayRecord({k: app.Array(as_array(v)) for k, v in tensors.items()})


def arrays_of(record) -> dict:
    """{name: numpy array} of an ArrayRecord."""
    return {k: a.numpy() for k, a in record.items()}


def train_content(instruction: RoundInstruction, weights: Mapping[str, Any], node: Mapping[str, Any]):
    """The RecordDict of one device's train message: its slice and its group's config. `node`: what the node
    needs besides (model, torch threads, memory), plain config values."""
    app = import_flwr()
    readable = {f"train.{k}": v for k, v in instruction.config.to_json().items() if _plain(v)}
    config = app.ConfigRecord({"instruction": json.dumps(instruction.to_json()), "device-id": instruction.device_id,
                               "server-round": instruction.round, "lr": instruction.lr, **readable, **node})
    return app.RecordDict({"arrays": array_record(weights), "config": config})


def instruction_of(content) -> RoundInstruction:
    return RoundInstruction.from_json(json.loads(content["config"]["instruction"]))


def reply_content(report: DeviceReport, peak_rss_bytes: int):
    """A reply's RecordDict: the trained tensors, the metrics, the report (its tensors left out)."""
    app = import_flwr()
    metrics = {"examples": report.examples, "upload-bytes": report.upload_bytes,
               "download-bytes": report.download_bytes, "peak-rss-bytes": peak_rss_bytes, "wall-s": report.wall_s,
               "ok": int(report.ok)}
    if report.loss_after is not None:
        metrics["train-loss"] = report.loss_after
    return app.RecordDict({"arrays": array_record(report.tensors), "metrics": app.MetricRecord(metrics),
                           "report": app.ConfigRecord({"report": json.dumps(report.summary(), default=_json)})})


def report_of(reply, instruction: RoundInstruction) -> DeviceReport:
    """The DeviceReport a reply carries; a reply with Flower's error (the ClientApp raised, its actor died)
    is the device's failed round."""
    if reply.has_error():
        return DeviceReport(round=instruction.round, device_id=instruction.device_id,
                            config_hash=instruction.config_hash, status=ReportStatus.FAILED,
                            reason=f"the ClientApp failed: {reply.error.reason}".strip())
    summary = json.loads(reply.content["report"]["report"])
    summary.pop("schema", None)
    return DeviceReport(**summary, tensors=arrays_of(reply.content["arrays"]))


def _plain(v) -> bool:
    """A value a ConfigRecord holds: a scalar, or a list of one kind of scalar."""
    if isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, list) and bool(v) and len({type(x) for x in v}) == 1 and isinstance(v[0], (int, float, str))


def _json(v):
    return v.tolist() if hasattr(v, "tolist") else str(v)
