"""Trainers: load a device's model state, train on local batches, return the trained tensors.
Each backend lives in its own module and is imported only when chosen."""
