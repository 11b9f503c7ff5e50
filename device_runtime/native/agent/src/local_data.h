// The device's local data against the artifact set it is about to train (device_runtime/local_data.py
// open_local_data, check_layout, check_labels): a folder with x.npy and y.npy is there and readable, x's examples
// have the shape and kind of numbers the set's first program takes, y has one row of targets per example and its
// labels are within the set's classes. Checked before the training process starts, so a device with the wrong
// data fails its round with one line naming the file and the fix instead of a trainer's error. An .npz is only
// checked to be there and an archive: the trainer reads its members and says what is wrong with them.
#pragma once

#include <string>

namespace edgefl::agent {

// "" when the data fits the set in `set_folder` (its manifest.json and prefix/manifest.json), else why not.
std::string check_local_data(const std::string& data, const std::string& set_folder);

}  // namespace edgefl::agent
