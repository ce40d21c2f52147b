"""`memra run --interactive` as a user runs it (a subprocess, turns on stdin), against the CPU
reference's greedy continuation of each turn's whole conversation rendered through the chat
template (memra.text.chat), computed here independently of the command."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_ref import ChatRef

ROOT = Path(__file__).resolve().parent.parent


def memra(*args, stdin=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("MEMRA_LOG", None)
    return subprocess.run([sys.executable, "-m", "memra", *args], capture_output=True, text=True,
                          cwd=ROOT, env=e, input=stdin, timeout=600)


@pytest.fixture(scope="module")
def smol():
    return ChatRef()


def reply(smol, messages, n):
    return smol.reply(messages, n)[0]


def test_a_conversation_is_the_reference_turn_by_turn(smol):
    sys_msg = {"role": "system", "content": "Answer briefly."}
    r = memra("run", "smollm2-135m", "-i", "--system", sys_msg["content"], "--temp", "0", "-n", "6",
              "--device", "cpu", stdin="Name a colour.\n\nWhy?\n/reset\nName a colour.\n/exit\nNever answered.\n")
    assert r.returncode == 0, r.stderr
    u1, u2 = {"role": "user", "content": "Name a colour."}, {"role": "user", "content": "Why?"}
    a1 = reply(smol, [sys_msg, u1], 6)
    a2 = reply(smol, [sys_msg, u1, {"role": "assistant", "content": a1}, u2], 6)
    # the empty line is skipped, /reset forgets the turns (the third reply is the first one's again), /exit ends it
    assert r.stdout == f"{a1}\n{a2}\n{a1}\n"
    assert r.stderr.count("tok in context") == 3 and "conversation reset" in r.stderr


def test_the_first_turn_may_come_with_p(smol):
    r = memra("run", "smollm2-135m", "-i", "-p", "Name a colour.", "--temp", "0", "-n", "4", "--device", "cpu",
              stdin="")
    assert r.returncode == 0, r.stderr
    assert r.stdout == reply(smol, [{"role": "user", "content": "Name a colour."}], 4) + "\n"


@pytest.mark.parametrize("args, needle", [
    ((), "give a prompt"),
    (("-i", "--json"), "--interactive"),
    (("-i", "-p", "-"), "-p -"),
])
def test_run_without_a_prompt_or_with_what_a_conversation_cannot_take(args, needle):
    r = memra("run", "smollm2-135m", "--device", "cpu", *args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("memra: error: ") and needle in lines[0], r.stderr
