"""The miniature BAGEL of r3-mini (upstream `modeling/bagel`).
Exports the config and module classes under upstream's names."""

from modeling.bagel.bagel import Bagel, BagelConfig, SequencePlan
from modeling.bagel.qwen2_navit import Qwen2Config, Qwen2ForCausalLM
from modeling.bagel.siglip_navit import SiglipVisionConfig, SiglipVisionModel

__all__ = [
    "Bagel",
    "BagelConfig",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "SequencePlan",
    "SiglipVisionConfig",
    "SiglipVisionModel",
]
