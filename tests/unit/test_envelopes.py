"""The instruction envelope names what a device fetches from its group's topics, and only that."""
import json

import pytest

from edgefl.errors import TransportError
from edgefl.messages import RoundInstruction
from edgefl.protocol.envelopes import Assignment
from edgefl.trainconfig import TrainConfig

SHA = "cd" * 32
INSTRUCTION = RoundInstruction(round=2, device_id="pi-1", config=TrainConfig(num_layers=4), weights_version=1,
                               seed=3, lr=0.1)


def test_shared_artifacts_round_trip_and_are_left_out_when_there_are_none():
    sent = Assignment(INSTRUCTION, None, {"set": SHA}, {SHA: "lab"})
    assert Assignment.loads(sent.dumps()) == sent
    plain = Assignment(INSTRUCTION, None, {"set": SHA})
    assert "shared" not in json.loads(plain.dumps())          # what an instruction was before groups shared
    assert Assignment.loads(plain.dumps()).shared == {}


@pytest.mark.parametrize("shared", [{SHA: "a/b"}, {SHA: "#"}, ["not", "a", "mapping"]])
def test_a_shared_group_that_is_not_one_topic_level_is_refused(shared):
    d = json.loads(Assignment(INSTRUCTION).dumps())
    d["shared"] = shared
    with pytest.raises(TransportError, match="malformed"):
        Assignment.loads(json.dumps(d).encode())
