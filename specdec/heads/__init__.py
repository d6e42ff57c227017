"""Trained draft heads (EAGLE-1/2 and EAGLE-3 layouts), the leaf drafters load: configs, modules, checkpoints and
shipped heads. Training and reports on heads live above the API, in :mod:`specdec.training`."""

from specdec.heads.checkpoint import HeadLoadError, load_head, save_head
from specdec.heads.config import HeadConfig, default_aux_layers
from specdec.heads.modules import EagleHead
from specdec.heads.shipped import shipped_head, shipped_heads

__all__ = ["EagleHead", "HeadConfig", "HeadLoadError", "default_aux_layers", "load_head", "save_head", "shipped_head",
           "shipped_heads"]
