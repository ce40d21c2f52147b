"""The oracle forward passes on the CPU: numpy reference (reference) and llama.cpp's CPU
numerics (llamacpp)."""
