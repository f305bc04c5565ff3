"""Target models: typed architecture specs, builders and safe checkpoints."""

from datarecon.models.spec import ARCHITECTURES, ArchSpec, build_model, count_parameters, is_homogeneous

__all__ = ["ARCHITECTURES", "ArchSpec", "build_model", "count_parameters", "is_homogeneous"]

from datarecon.models.checkpoint import ModelBundle, load_model_dir, read_model_meta, save_model_dir  # noqa: E402

__all__ += ["ModelBundle", "load_model_dir", "read_model_meta", "save_model_dir"]
