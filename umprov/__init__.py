"""umprov: provision GPU hosts, deploy a PyTorch-CUDA container, prove every GPU healthy."""

__version__ = "0.1.0"
