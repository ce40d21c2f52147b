"""memra: a kernel-first LLM inference toolkit for NVIDIA GPUs."""

__version__ = "0.1.0"
