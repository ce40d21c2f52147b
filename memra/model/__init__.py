"""What a model file is: GGUF reading (gguf), hyper-parameters (config), quantized block
formats (quants), model aliases and their cache (aliases), synthetic models (synth)."""
