"""Whole layers assembled from the families' ops (the inference layer of the curriculum)."""

from cute_kernels.models.llama import LlamaConfig, LlamaDecoderLayer, fuse_hf_state_dict, reference_forward

__all__ = ["LlamaConfig", "LlamaDecoderLayer", "fuse_hf_state_dict", "reference_forward"]
