"""ServerApp: Flower's message-API FedAvg with one step overridden, client selection.

Stock FedAvg samples node ids with an unseeded `random.sample`, and simulation node ids are random and do
not map to partitions. `ScheduledFedAvg.configure_train` instead sends round r's message to as many nodes
as the bench's schedule lists clients and names in each message the partition to train (with the round's
learning rate and the client's seed): the same clients train in the same rounds as in edgefl and the lean
loop. Aggregation (weighted by num-examples), the round loop and the simulation engine are Flower's.
Client-side evaluation is off (fraction_evaluate=0); the global model is evaluated centrally after the
last round. The app records wall-clock times (time.time()) of each round's start and end in `out`.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedbench import task

app = ServerApp()


class ScheduledFedAvg(FedAvg):
    def __init__(self, schedule: dict, times: dict, **kwargs):
        super().__init__(**kwargs)
        self.schedule = {r["round"]: r for r in schedule["rounds"]}
        self.times = times

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        self.times["round_start"].append(time.time())
        plan = self.schedule[server_round]
        nodes = sorted(grid.get_node_ids())
        chosen = random.Random(server_round).sample(nodes, len(plan["clients"]))
        messages = []
        for node, client, seed in zip(chosen, plan["clients"], plan["seeds"], strict=True):
            cfg = ConfigRecord({**config, "server-round": server_round, "partition-id": client, "seed": seed,
                                "lr": plan["lr"]})
            messages.append(Message(content=RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg}),
                                    message_type=MessageType.TRAIN, dst_node_id=node))
        return messages


@app.main()
def main(grid: Grid, context: Context) -> None:
    started = time.time()
    cfg = context.run_config
    schedule = json.loads(Path(cfg["schedule"]).read_text())
    rounds = len(schedule["rounds"])
    model = task.cnn()
    model.load_state_dict(task.initial_state(cfg["initial"], model))
    times = {"serverapp_start": started, "round_start": [], "round_end": []}
    result_metrics = {}

    def evaluate(server_round: int, arrays: ArrayRecord):
        if server_round == 0:
            return None
        if server_round == rounds:
            model.load_state_dict(arrays.to_torch_state_dict())
            data = task.load(cfg["data"])
            result_metrics.update(task.evaluate(model, data["x_test"], data["y_test"]))
        times["round_end"].append(time.time())
        return MetricRecord(result_metrics) if server_round == rounds else None

    strategy = ScheduledFedAvg(schedule, times, fraction_evaluate=0.0)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                   train_config=ConfigRecord({"batch-size": cfg["batch-size"], "local-epochs": cfg["local-epochs"]}),
                   evaluate_fn=evaluate)
    Path(cfg["out"]).write_text(json.dumps({**times, **result_metrics, "rounds": rounds}))
