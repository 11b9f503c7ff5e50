"""Local data read a batch at a time (edgefl.device_runtime.local_data): the rows asked for, in the model
input's dtype, from a folder or an uncompressed .npz, with y as each example's targets however it was saved;
bad files are one-line errors."""
import numpy as np
import pytest

from edgefl.device_runtime.local_data import open_local_data
from edgefl.errors import ConfigError

X = np.arange(7 * 2 * 3, dtype=np.uint8).reshape(7, 2, 3)


@pytest.mark.parametrize("form", ["folder", "npz"])
@pytest.mark.parametrize("y", [np.arange(7) % 3, np.arange(7 * 4).reshape(7, 4), np.arange(7 * 4)],
                         ids=["classes", "lm", "lm-flat"])
def test_rows_come_back_as_numpy_indexes_them(form, y, tmp_path):
    if form == "folder":
        np.save(tmp_path / "x.npy", X)
        np.save(tmp_path / "y.npy", y)
        path = tmp_path
    else:
        path = tmp_path / "d.npz"
        np.savez(path, x=X, y=y)
    x_rows, y_rows = open_local_data(path)
    per_example = y.reshape(7, -1) if y.size > 7 else y
    idx = np.array([6, 0, 1, 2, 2, 5])
    assert np.array_equal(x_rows[idx], X[idx]) and np.array_equal(y_rows[idx], per_example[idx])
    assert np.array_equal(x_rows[2:5], X[2:5]) and len(y_rows) == 7
    as_float = x_rows.astype(np.float32)
    assert as_float[idx].dtype == np.float32 and np.array_equal(as_float[idx], X[idx].astype(np.float32))
    assert np.array_equal(x_rows.head(3)[0:10], X[:3])


def test_bad_files_are_one_line_errors(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", x=X, y=np.zeros(7))
    with pytest.raises(ConfigError, match="compressed; save the data with numpy.savez"):
        open_local_data(tmp_path / "c.npz")
    np.savez(tmp_path / "n.npz", y=np.zeros(7))
    with pytest.raises(ConfigError, match="no array 'x'"):
        open_local_data(tmp_path / "n.npz")
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.zeros(9))
    with pytest.raises(ConfigError, match="x has 7 examples and y 9 targets"):
        open_local_data(tmp_path)
    with pytest.raises(ConfigError, match="absent not found"):
        open_local_data(tmp_path / "absent")
