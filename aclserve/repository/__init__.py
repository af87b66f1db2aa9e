"""The model repository: layout scan, settle rules, hot reload without failed requests."""
from .repository import ModelLoadFailed, ModelRepository, RepositoryError
from .served import ServedVersion
from .status import State

__all__ = ["ModelRepository", "ModelLoadFailed", "RepositoryError", "ServedVersion", "State"]
