"""`memra run --interactive`: a conversation on one loaded engine.

User turns come from stdin, one line each (on a terminal with a `> ` prompt and line editing);
each reply is generated over the whole conversation rendered through the model's chat
template, streamed to stdout, and appended to it as the assistant's turn. One sampler serves
every turn, so a seed makes the whole conversation reproducible. Commands: `/reset` (forget
the turns, keep the system message), `/exit` (or the end of input). A turn that no longer fits
the context is refused with the count and the conversation kept."""

from __future__ import annotations

import sys
import time

from memra.cli.common import err
from memra.errors import MemraError

HELP = "/reset forgets the turns (keeps the system message) · /exit quits (or end of input)"


def _lines(tty: bool):
    """The user's lines: input() with a prompt on a terminal, else stdin's lines."""
    while True:
        if tty:
            try:
                line = input("> ")
            except EOFError:
                return
        else:
            line = sys.stdin.readline()
            if not line:
                return
        yield line.rstrip("\n")


def converse(engine, gguf, tok, params, sampler, *, system: str | None, first: str | None, n_ctx: int,
             device: str, ignore_eos: bool = False, spec=None, constraint=None) -> int:
    """Run the conversation until /exit or the end of input; returns the number of replies."""
    from memra.session import generate, prompt_ids

    base = [{"role": "system", "content": system}] if system is not None else []
    messages = list(base)
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    if tty:
        err.print(f"[dim]{HELP}[/dim]")
    turns = ([first] if first is not None else [])
    lines = _lines(tty)
    replies = 0
    while True:
        if turns:
            user = turns.pop(0)
        else:
            user = next(lines, None)
            if user is None:
                break
        cmd = user.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            break
        if cmd == "/reset":
            messages = list(base)
            err.print("[dim]conversation reset[/dim]")
            continue
        if cmd in ("/help", "/?"):
            err.print(f"[dim]{HELP}[/dim]")
            continue
        messages.append({"role": "user", "content": user})
        ids, _ = prompt_ids(gguf, tok, messages=messages)
        if len(ids) >= n_ctx:
            messages.pop()
            print(f"memra: the conversation would be {len(ids)} tokens; the context holds {n_ctx} "
                  f"(/reset starts over, --ctx makes it larger)", file=sys.stderr, flush=True)
            continue
        pieces, final, ttft = [], None, None
        t0 = time.perf_counter()
        for ev in generate(engine, tok, ids, params, n_ctx=n_ctx, ignore_eos=ignore_eos, sampler=sampler,
                           spec=spec, constraint=constraint):
            if ttft is None:
                ttft = time.perf_counter() - t0
            if ev.done:
                final = ev
                break
            pieces.append(ev.text)
            if ev.text:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if final is None:
            raise MemraError("the generation ended without its final event")
        messages.append({"role": "assistant", "content": "".join(pieces)})
        replies += 1
        t = final.timings
        dc = f"{t.decode_tok_s:.1f} tok/s" if t.decode_tok_s else "-"
        err.print(f"[dim]{device}: TTFT {ttft:.2f} s · {t.n_prompt} tok in context · {t.n_gen} tok {dc} · "
                  f"{final.finish_reason}[/dim]")
    return replies
