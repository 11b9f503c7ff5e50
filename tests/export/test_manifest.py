"""manifest.json: written, read back and validated; tampering and missing files are ArtifactErrors naming
the file; flat upload buffers; refreshing a set's weights without re-exporting its graphs."""
import json
import shutil

import numpy as np
import pytest
import torch
from export_cases import EXPORTS, RESNET, global_state, resnet_config

from edgefl.device_runtime.trainers.base import open_trainer
from edgefl.errors import ArtifactError, ReportRejected
from edgefl.export.backends import get_backend
from edgefl.export.pipeline import refresh_weights
from edgefl.manifest import MANIFEST, SCHEMA, ArtifactSet, Manifest, flatten, unflatten
from edgefl.server.submodel import extract, index_sets

pytestmark = EXPORTS

CONFIG = resnet_config(7, 0.25)


@pytest.fixture
def artifact_copy(exported, tmp_path):
    """A private copy of an exported ORT set (prefix of 7 layers, head width 0.25) to damage."""
    source = exported("ort", RESNET, CONFIG).folder
    return shutil.copytree(source, tmp_path / "set")


def test_manifest_describes_the_set(exported):
    a = exported("ort", RESNET, CONFIG)
    m, p = a.suffix, a.prefix
    assert m.schema == SCHEMA == json.loads((a.folder / MANIFEST).read_text())["schema"]
    assert Manifest.read(a.folder) == m and m.id == Manifest.read(a.folder).id
    assert m.kind == "suffix" and p.kind == "prefix" and m.prefix_id == p.id
    assert m.config_hash == CONFIG.hash() and m.batch_size == CONFIG.batch_size
    assert {"onnxruntime", "onnx", "torch"} <= set(m.versions)
    assert [i.name for i in m.inputs] == ["features0", "labels"] and [o.name for o in m.outputs][:2] == ["loss", "logits"]
    assert [o.shape for o in p.outputs] == [("batch", 16, 8, 8)]    # layer 6 ends the first stage
    # trainable: layers 7.. in global order, no frozen tensor; frozen: layers 0..6
    assert all(int(e.name.split(".")[1]) >= 7 for e in m.trainable)
    assert {int(e.name.split(".")[1]) for e in p.frozen} == set(range(7))
    assert {e.kind for e in m.trainable} == {"parameter", "statistic", "counter"}
    assert m.upload_bytes == 4 * sum(e.numel for e in m.trainable)
    assert m.predicted["peak_memory_bytes"] > m.predicted["runtime_baseline_bytes"] > 0
    for f in (*m.files, *p.files):
        assert f.bytes > 0 and len(f.sha256) == 64


def test_flat_buffer_round_trip(exported):
    m = exported("ort", RESNET, CONFIG).suffix
    rng = np.random.default_rng(0)
    tensors = {e.name: (rng.integers(0, 100, e.shape) if e.kind == "counter" else rng.standard_normal(e.shape))
               .astype(e.dtype) for e in m.trainable}
    buffer = flatten(m.trainable, tensors)
    assert buffer.dtype == np.float32 and buffer.nbytes == m.upload_bytes
    back = unflatten(m.trainable, buffer)
    assert list(back) == [e.name for e in m.trainable]
    for e in m.trainable:
        assert back[e.name].dtype == np.dtype(e.dtype)
        np.testing.assert_array_equal(back[e.name], tensors[e.name])
    with pytest.raises(ReportRejected, match="holds"):
        unflatten(m.trainable, buffer[:-1])


@pytest.mark.parametrize("where", ["checkpoint", "prefix/prefix.onnx", "training_model.onnx"])
def test_one_changed_byte_is_caught(artifact_copy, where):
    path = artifact_copy / where
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"{path}: sha256 does not match"):
        ArtifactSet.open(artifact_copy)


def test_a_missing_file_is_named(artifact_copy):
    manifest = json.loads((artifact_copy / MANIFEST).read_text())
    manifest["files"].append({**manifest["files"][0], "name": "extra_model.onnx"})
    (artifact_copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"{artifact_copy / 'extra_model.onnx'}: named in the manifest but missing"):
        ArtifactSet.open(artifact_copy)


def test_bad_manifests_are_artifact_errors(artifact_copy, tmp_path):
    path = artifact_copy / MANIFEST
    good = json.loads(path.read_text())
    for broken, needle in [({**good, "schema": "edgefl.manifest/0"}, "schema is 'edgefl.manifest/0'"),
                           ({k: v for k, v in good.items() if k != "files"}, "malformed manifest"),
                           ({**good, "files": [{"name": "../x", "bytes": 1, "sha256": "0", "role": "x"}]},
                            "leaves the artifact folder")]:
        path.write_text(json.dumps(broken))
        with pytest.raises(ArtifactError, match=needle):
            Manifest.read(artifact_copy)
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match="not JSON"):
        Manifest.read(artifact_copy)
    with pytest.raises(ArtifactError, match="missing; not an artifact folder"):
        Manifest.read(tmp_path / "nowhere")


def test_a_foreign_prefix_is_refused(exported, artifact_copy):
    other = exported("ort", RESNET, resnet_config(4, 0.25)).folder
    shutil.rmtree(artifact_copy / "prefix")
    shutil.copytree(other / "prefix", artifact_copy / "prefix")
    with pytest.raises(ArtifactError, match="is not the prefix the suffix needs"):
        ArtifactSet.open(artifact_copy)


def test_refresh_rewrites_weights_not_graphs(artifact_copy, one_thread):
    old = Manifest.read(artifact_copy)
    old_prefix = Manifest.read(artifact_copy / "prefix")
    new_state = {k: (v + 0.01 * torch.randn(v.shape) if v.is_floating_point() else v + 5)
                 for k, v in global_state(RESNET).items()}
    refreshed = refresh_weights(artifact_copy, new_state, get_backend("ort"))
    m = refreshed.suffix
    assert m.weights_version == old.weights_version + 1
    changed = {f.name for f in m.files} - {f.name for f in m.files if f in old.files}
    assert changed == {"checkpoint"}                            # the graphs are untouched
    assert refreshed.prefix.id != old_prefix.id == old.prefix_id  # the frozen layers changed: a new prefix
    trainer = open_trainer(artifact_copy)
    want = extract(new_state, RESNET, CONFIG, index_sets(RESNET, CONFIG))
    for e in m.trainable:
        np.testing.assert_array_equal(trainer.trained_tensors()[e.name], want[e.local].numpy())
