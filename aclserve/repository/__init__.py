"""The model repository: layout scan, settle rules, hot reload without failed requests."""
from .control_calls import check_control_mode
from .models_folder import RepositoryError, check_models_folder
from .repository import ModelLoadFailed, ModelRepository
from .served import ServedVersion
from .status import State

__all__ = ["ModelRepository", "ModelLoadFailed", "RepositoryError", "ServedVersion", "State", "check_control_mode",
           "check_models_folder"]
