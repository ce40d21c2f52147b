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


# -- answers kept between runs ---------------------------------------------------------------

def _cache_dir():
    import os
    from pathlib import Path

    return Path(os.environ.get("MEMRA_HOME") or Path.home() / ".cache" / "memra") / "parity" / "peer"


def _file_sha256(path) -> str:
    """sha256 of a model file, remembered per (path, size, mtime) so a 1 GB file is read once."""
    import hashlib
    import json
    import os
    from pathlib import Path

    path = Path(path).resolve()
    st = path.stat()
    memo_file = _cache_dir() / "files.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    if key not in memo:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        memo[key] = h.hexdigest()
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_file)
    return memo[key]


class CachedPeer:
    """LlamaCppPeer's answers kept on disk ($MEMRA_HOME/parity/peer/), so a test run that
    already asked llama.cpp the same question of the same file does not start it again.

    An answer is llama.cpp's own output, never memra's: it is keyed by the model file's
    sha256, the xllamacpp version (pinned in pyproject.toml), this module's source (the
    server settings and request bodies) and the request itself, and llama.cpp's CPU build
    answers a given request on a given file the same way every time (the parity tests rely
    on that already). The server starts on the first question not in the cache.
    MEMRA_PEER_CACHE=0 asks llama.cpp every time."""

    def __init__(self, model_path, **kw):
        import hashlib
        import json
        import os
        from importlib.metadata import version
        from pathlib import Path

        self._path, self._kw, self._peer = model_path, kw, None
        self._use = os.environ.get("MEMRA_PEER_CACHE", "1") != "0"
        source = Path(__file__).read_bytes()
        self._base = json.dumps({"xllamacpp": version("xllamacpp"), "peer": hashlib.sha256(source).hexdigest(),
                                 "file": _file_sha256(model_path) if self._use else None,
                                 "kw": sorted(kw.items())}, sort_keys=True)

    def _ask(self, method: str, *args, **kwargs):
        import hashlib
        import json
        import os

        if not self._use:
            return getattr(self._live(), method)(*args, **kwargs)
        key = hashlib.sha256((self._base + json.dumps([method, args, sorted(kwargs.items())])).encode()).hexdigest()
        f = _cache_dir() / f"{key}.json"
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            pass
        answer = getattr(self._live(), method)(*args, **kwargs)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(answer))
        os.replace(tmp, f)
        return json.loads(f.read_text())  # the same types whether the answer was cached or not

    def _live(self) -> LlamaCppPeer:
        if self._peer is None:
            self._peer = LlamaCppPeer(self._path, **self._kw)
        return self._peer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._ask("tokenize", text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self._ask("detokenize", list(ids))

    def complete(self, prompt, n_predict: int, n_probs: int = 2) -> dict:
        r = self._ask("complete", prompt, n_predict, n_probs=n_probs)
        r["top"] = [None if t is None else [tuple(x) for x in t] for t in r["top"]]
        return r

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
            self._peer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
