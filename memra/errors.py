"""The error types memra raises. Each carries enough context to name what is wrong."""

from __future__ import annotations


class MemraError(Exception):
    """Base class: a clear, one-line message meant for the user."""


class GGUFError(MemraError):
    """A GGUF file that is truncated, malformed or uses something memra does not support."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class UnsupportedModelError(MemraError):
    """An architecture, tensor type or hyper-parameter memra does not implement."""


class ModelNotFoundError(MemraError):
    """Neither a readable file nor a known alias."""


class TokenizerError(MemraError):
    """Tokenizer metadata missing or inconsistent."""


class TemplateError(MemraError):
    """A chat template that fails to render (including raise_exception from the template)."""


class CompileError(MemraError):
    """NVRTC rejected a kernel; carries the compiler log."""

    def __init__(self, kernel_file: str, options: list[str], log: str):
        self.kernel_file = kernel_file
        self.options = list(options)
        self.log = log
        super().__init__(f"NVRTC failed to compile {kernel_file} ({' '.join(options)}):\n{log}")


class CudaError(MemraError):
    """A CUDA driver call failed, or no usable GPU is present."""


class ContextOverflowError(MemraError):
    """A prompt (plus requested tokens) longer than the context the engine was built for."""
