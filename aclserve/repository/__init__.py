"""The model repository: layout scan, settle rules, hot reload without failed requests."""
from .repository import ModelLoadFailed, ModelRepository, RepositoryError
from .served import LOADING, READY, UNAVAILABLE, UNLOADING, ServedVersion

__all__ = ["ModelRepository", "ModelLoadFailed", "RepositoryError", "ServedVersion",
           "LOADING", "READY", "UNAVAILABLE", "UNLOADING"]
