"""Datasets, tasks, deterministic selection and normalisation.

Typical use::

    from datarecon.data import DataSpec, load_task

    spec = DataSpec(dataset="cifar10", task="vehicles-animals", n_per_class=250)
    data = load_task(spec)                     # data_dir: arg, $DATARECON_DATA, or user cache
    x = data.normalisation.to_model(data.train.x)   # model input space
    y = data.train.y                           # float {-1, +1} (binary) / int64 (multiclass)

See :mod:`datarecon.data.formats` (file formats), :mod:`~datarecon.data.datasets`
(where files live), :mod:`~datarecon.data.tasks` (label conventions),
:mod:`~datarecon.data.selection` (which images), :mod:`~datarecon.data.download`.
"""

from datarecon.data.datasets import (
    DATASETS,
    ENV_VAR,
    DatasetInfo,
    clear_cache,
    dataset_counts,
    load_dataset,
    locate_dataset,
    resolve_data_dir,
)
# the function is exported as ``download_dataset`` so that ``datarecon.data.download``
# stays the module (``import datarecon.data.download as dl`` works, e.g. for monkeypatching)
from datarecon.data.download import download as download_dataset
from datarecon.data.download import md5_file, verify_md5
from datarecon.data.formats import (
    CIFAR10_CLASSES,
    DIGITS_TRAIN_SIZE,
    RawDataset,
    RestrictedUnpickler,
    read_cifar_bin,
    read_cifar_pickle,
    read_idx_images,
    read_idx_labels,
    restricted_unpickle,
)
from datarecon.data.normalisation import NORMALISATION_KINDS, Normalisation
from datarecon.data.selection import DataSpec, Split, TaskData, load_task, select_indices
from datarecon.data.tasks import TASKS, ResolvedTask, TaskDef, resolve_task, valid_tasks

__all__ = [
    "CIFAR10_CLASSES", "DATASETS", "DIGITS_TRAIN_SIZE", "ENV_VAR", "NORMALISATION_KINDS", "TASKS",
    "DataSpec", "DatasetInfo", "Normalisation", "RawDataset", "ResolvedTask", "RestrictedUnpickler",
    "Split", "TaskData", "TaskDef", "clear_cache", "dataset_counts", "download_dataset",
    "load_dataset", "load_task", "locate_dataset", "md5_file", "read_cifar_bin",
    "read_cifar_pickle", "read_idx_images", "read_idx_labels", "resolve_data_dir", "resolve_task",
    "restricted_unpickle", "select_indices", "valid_tasks", "verify_md5",
]
