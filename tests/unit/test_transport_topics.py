"""The v1 topic scheme: every topic the protocol builds parses back to what it names; anything else is
ignored, and device ids that cannot be one topic level are refused with the fix."""
import pytest

from edgefl import topics
from edgefl.errors import ConfigError

SHA = "ab" * 32


@pytest.mark.parametrize("topic, expected", [
    (topics.instruction("pi-1"), topics.Topic("instr", "pi-1")),
    (topics.artifact_manifest("pi-1", SHA), topics.Topic("manifest", "pi-1", sha=SHA)),
    (topics.artifact_chunk("pi-1", SHA, 12), topics.Topic("chunk", "pi-1", sha=SHA, seq=12)),
    (topics.ack("pi-1"), topics.Topic("ack", "pi-1")),
    (topics.result_meta("pi-1", 3, "0123456789abcdef"), topics.Topic("result_meta", "pi-1", round=3,
                                                                    upload="0123456789abcdef")),
    (topics.result_chunk("pi-1", 3, "0123456789abcdef", 0), topics.Topic("result_chunk", "pi-1", round=3, seq=0,
                                                                        upload="0123456789abcdef")),
    (topics.receipt("pi-1"), topics.Topic("receipt", "pi-1")),
    (topics.metrics("pi-1"), topics.Topic("metrics", "pi-1")),
    (topics.presence("pi-1"), topics.Topic("presence", "pi-1")),
    (topics.BROADCAST_ROUND, topics.Topic("broadcast")),
    (topics.group_manifest("lab", SHA), topics.Topic("manifest", sha=SHA, group="lab")),
    (topics.group_chunk("lab", SHA, 4), topics.Topic("chunk", sha=SHA, seq=4, group="lab")),
])
def test_every_topic_parses_back(topic, expected):
    assert topics.parse(topic) == expected


@pytest.mark.parametrize("topic", ["fl/v2/dev/pi/down/instr", "fl/v1/dev/pi/up/result/x/meta",
                                   f"fl/v1/dev/pi/down/artifact/{SHA}/c/one", "fl/v1/dev/pi/down/artifact/abc/manifest",
                                   "fl/v1/dev/pi", "other/topic", f"fl/v1/group/lab/art/{SHA}/c/x",
                                   "fl/v1/group/lab/art/abc/manifest", f"fl/v1/group/lab/art/{SHA}/other"])
def test_anything_else_is_ignored(topic):
    assert topics.parse(topic) is None


def test_filters_match_as_mqtt_does():
    down, broadcast = topics.device_filters("pi")
    assert topics.matches(down, topics.artifact_chunk("pi", SHA, 0))
    assert not topics.matches(down, topics.instruction("pj"))
    assert topics.matches(broadcast, topics.BROADCAST_ROUND)
    assert all(any(topics.matches(f, t) for f in topics.COORDINATOR_FILTERS)
               for t in (topics.ack("pi"), topics.result_chunk("pi", 1, "0" * 16, 2), topics.presence("pi")))
    assert not any(topics.matches(f, topics.instruction("pi")) for f in topics.COORDINATOR_FILTERS)
    assert topics.matches(topics.group_chunks("lab", SHA), topics.group_chunk("lab", SHA, 7))
    assert not topics.matches(topics.group_chunks("lab", SHA), topics.group_manifest("lab", SHA))
    # the coordinator hears retained group manifests (a previous run's, to clear them), never their chunks
    assert any(topics.matches(f, topics.group_manifest("lab", SHA)) for f in topics.COORDINATOR_FILTERS)
    assert not any(topics.matches(f, topics.group_chunk("lab", SHA, 0)) for f in topics.COORDINATOR_FILTERS)


@pytest.mark.parametrize("bad", ["", "a/b", "a+b", "room #1", "$SYS"])
def test_device_ids_that_are_not_one_topic_level_are_refused(bad):
    with pytest.raises(ConfigError, match="letters, digits"):
        topics.check_device_id(bad)


@pytest.mark.parametrize("bad", ["", "a/b", "room #1", "$lab", "two words"])
def test_group_names_that_are_not_one_topic_level_are_refused(bad):
    with pytest.raises(ConfigError, match="rename the group"):
        topics.check_group(bad)
