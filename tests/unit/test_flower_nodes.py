"""Which fleet device a Flower node is (edgefl.flower.client.node_device), without Flower: a deployed supernode
names its device in its node config (`device-id`), a simulated one has a partition id; anything else is one line
naming the key and the fix."""
import pytest

from edgefl.errors import ConfigError
from edgefl.flower.client import NodeData, node_device

FLEET = "fleet:\n  groups:\n    phone: {count: 3, memory_budget: 1GiB, runtime: torch}\n    pi: {ids: [lab-a], memory_budget: 1GiB}\n"


@pytest.fixture
def data(tmp_path):        # the shares are split from Fashion-MNIST (Debian's dataset-fashion-mnist)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    return NodeData(str(fleet), "fashion-mnist", train_limit=400)


def test_a_deployed_node_is_the_device_its_node_config_names(data):
    assert node_device(data, {"device-id": "phone-2"}) == "phone-2"
    assert node_device(data, {"device-id": "lab-a", "partition-id": 0}) == "lab-a"     # the name wins


def test_a_simulated_node_is_the_device_at_its_partition_id(data):
    assert [node_device(data, {"partition-id": i}) for i in range(4)] == ["lab-a", "phone-0", "phone-1", "phone-2"]


@pytest.mark.parametrize("config, said", [
    ({"device-id": "phone-7"}, "node config device-id='phone-7': not a device of the fleet"),
    ({"partition-id": 4}, "node with partition-id 4: the fleet"),
    ({}, "a node config with neither device-id nor partition-id: start each supernode with --node-config "
         "\"device-id='<its fleet device id>'\""),
])
def test_a_node_that_is_no_device_of_the_fleet_is_one_line(data, config, said):
    with pytest.raises(ConfigError) as e:
        node_device(data, config)
    assert said in str(e.value) and "\n" not in str(e.value)
