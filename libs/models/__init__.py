"""Base-model catalogue and bootstrap."""

from libs.models.catalog import CATALOG, BaseModelSpec, ModuleShape, get_spec

__all__ = ["CATALOG", "BaseModelSpec", "ModuleShape", "get_spec"]
