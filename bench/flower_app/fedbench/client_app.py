"""ClientApp: trains the partition its message names (see server_app) and replies with the weights and
its example count, as in Flower's PyTorch quickstart."""
from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedbench import task

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content["config"]
    x, y = task.partition(context.run_config["data"], int(cfg["partition-id"]))
    model = task.cnn()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    losses = task.train(model, x, y, lr=float(cfg["lr"]), seed=int(cfg["seed"]), epochs=int(cfg["local-epochs"]),
                        batch_size=int(cfg["batch-size"]))
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                        "metrics": MetricRecord({"train_loss": losses[-1], "num-examples": len(y)})})
    return Message(content=reply, reply_to=msg)
