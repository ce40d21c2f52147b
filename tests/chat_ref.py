"""The CPU reference's greedy chat reply, the oracle of the tests of `memra run --interactive`
and of the server's Responses API: the messages rendered through the model's chat template
(memra.text.chat), the prompt in one forward pass, then one greedy token at a time."""

import numpy as np

from memra.cpu.reference import ReferenceModel
from memra.model.aliases import resolve
from memra.model.gguf import open_gguf
from memra.text.chat import chat_tokens, render_chat
from memra.text.tokenizer import Tokenizer


class ChatRef:
    def __init__(self, model: str = "smollm2-135m"):
        self.g = open_gguf(resolve(model))
        self.tok = Tokenizer.from_gguf(self.g)
        self.m = ReferenceModel(self.g, numerics="llamacpp")

    def reply(self, messages, n: int) -> tuple[str, int]:
        """(the greedy reply's text, at most n tokens and ending before an end-of-generation token;
        the prompt's token count)."""
        ids = chat_tokens(self.tok, render_chat(self.g, messages, add_generation_prompt=True))
        cache = self.m.new_cache(len(ids) + n + 1)
        lg, out = self.m.forward(ids, cache), []
        for _ in range(n):
            t = int(np.argmax(lg))
            if t in self.tok.eog_ids:
                break
            out.append(t)
            lg = self.m.forward([t], cache)
        return self.tok.decode(out, skip_special=True), len(ids)
