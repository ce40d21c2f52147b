"""Text <-> tokens: the tokenizers (tokenizer, pretokenize) and chat templates (chat)."""
