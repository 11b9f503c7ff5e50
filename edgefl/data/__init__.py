"""Data for federated emulation: loaders returning numpy `Dataset`s, partitioners, augmentation.

Everything reads local files; nothing is downloaded. numpy is the only import.
"""
from edgefl.data.augment import augment
from edgefl.data.base import Dataset, data_root, subset
from edgefl.data.cifar import cifar
from edgefl.data.mnist import fashion_mnist, mnist, mnist_hint
from edgefl.data.partition import Partition, dirichlet, iid, natural, parse_partition, shards
from edgefl.data.registry import dataset_names, load_dataset, load_split
from edgefl.data.shares import device_shares, save_share
from edgefl.data.text import IGNORE_INDEX, Corpus, decode, encode, pretrain_corpus, shakespeare

__all__ = [
    "Corpus", "Dataset", "IGNORE_INDEX", "Partition", "augment", "cifar", "data_root", "dataset_names",
    "decode", "device_shares", "dirichlet", "encode", "fashion_mnist", "iid", "load_dataset", "load_split", "mnist", "mnist_hint",
    "natural", "parse_partition", "pretrain_corpus", "save_share", "shakespeare", "shards", "subset",
]
