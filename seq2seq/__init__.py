"""seq2seq: attention-based neural machine translation, RNN and Transformer side by side.

    from seq2seq import Translator, RunConfig, train
"""
__version__ = "0.1.0"

from .config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from .errors import UserError  # noqa: E402
from .models import build_model  # noqa: E402
from .training import TrainResult, train  # noqa: E402
from .translator import Translation, Translator  # noqa: E402

__all__ = ["DataConfig", "ModelConfig", "RunConfig", "TrainConfig", "UserError", "build_model",
           "TrainResult", "train", "Translation", "Translator"]
