"""The GPU engine: the device (cuda), NVRTC (compile), the decode engine (engine), the
shared q8 activation format (q8), output comparison (compare), one launcher module per
kernel family (ops/). Nothing here imports the tune harness or the CLI."""
