"""llama.cpp as the test oracle: PyPI's xllamacpp (llama.cpp's CPU build with its server).

`LlamaCppPeer(path)` starts llama.cpp's server in-process on a loopback port and offers the
calls the parity tests need: `tokenize` (the `/tokenize` endpoint, add_special and
parse_special as memra's `tokenize` command promises), `detokenize`, and `complete`
(greedy completion with `n_probs` top log-probabilities per generated token).
"""

from __future__ import annotations

import socket

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCppPeer:
    def __init__(self, model_path, n_ctx: int = 4096, threads: int = 2):
        import xllamacpp as x

        p = x.CommonParams()
        p.model.path = str(model_path)
        p.n_ctx = n_ctx
        p.n_parallel = 1
        p.n_batch = 512
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.port = _free_port()
        p.warmup = False
        self._server = x.Server(p)
        self.url = self._server.listening_address
        self._http = httpx.Client(base_url=self.url, timeout=600)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        r = self._http.post("/tokenize", json={"content": text, "add_special": add_special,
                                               "parse_special": parse_special})
        r.raise_for_status()
        return r.json()["tokens"]

    def detokenize(self, ids: list[int]) -> str:
        r = self._http.post("/detokenize", json={"tokens": ids})
        r.raise_for_status()
        return r.json()["content"]

    def complete(self, prompt: str | list[int], n_predict: int, n_probs: int = 2) -> dict:
        """Greedy continuation. Returns {'ids': [...], 'top': [[(id, logprob), ...] per position]}.

        llama.cpp reports no probabilities for a token whose text is an incomplete UTF-8
        sequence (a byte token, say): it folds the text into the next token's entry and
        drops the rest. So `ids` comes from the server's token list (every generated id),
        and `top[i]` is None at the positions llama.cpp gave no probabilities for.
        """
        r = self._http.post("/completion", json={
            "prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1,
            "n_probs": n_probs, "cache_prompt": False, "ignore_eos": True,
            "samplers": ["top_k"], "return_tokens": True,
        })
        r.raise_for_status()
        r = r.json()
        ids = list(r["tokens"])
        entries = r.get("completion_probabilities", [])
        top: list = [None] * len(ids)
        j = 0
        for i, tok in enumerate(ids):  # each entry belongs to the last token of its group
            if j < len(entries) and entries[j]["id"] == tok:
                top[i] = [(t["id"], t["logprob"]) for t in entries[j]["top_logprobs"]]
                j += 1
        if j != len(entries):
            raise RuntimeError(f"llama.cpp's probabilities do not align with its tokens {ids}")
        return {"ids": ids, "top": top, "text": r["content"]}

    def close(self) -> None:
        self._http.close()
        del self._server

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
