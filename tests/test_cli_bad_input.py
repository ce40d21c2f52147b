"""Bad input on the command line: each case is one `memra: error:` line naming what is wrong
and exit 1 — never a traceback, an "internal error", a crash or a silent default."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def memra_cli(*args, env=None, timeout=120):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("MEMRA_LOG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "memra", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=timeout, stdin=subprocess.DEVNULL)


def one_error_line(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("memra: error: "), r.stderr
    assert "internal error" not in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_run_threads_beyond_any_machine_is_an_error():
    # numba starts every thread it is given: a million crashed the process with SIGSEGV
    one_error_line(memra_cli("run", "-p", "x", "--device", "cpu", "-t", "1000000"), "-t/--threads", "1000000")


def test_synth_bad_seed_threads_and_output(tmp_path):
    out = tmp_path / "x.gguf"
    one_error_line(memra_cli("synth", out, "--seed", "-1"), "seed", "-1")
    one_error_line(memra_cli("synth", out, "--threads", "-3"), "--threads", "-3")
    one_error_line(memra_cli("synth", out, "--threads", "0"), "--threads", "0")
    for args in ([tmp_path], [tmp_path, "--tokenizer-only"]):
        one_error_line(memra_cli("synth", *args), str(tmp_path), "is a folder")
        assert tmp_path.is_dir()
    for extra in ([], ["--tokenizer-only"]):
        one_error_line(memra_cli("synth", "", *extra), "is a folder")
    assert not out.exists()


def test_spec_check_bad_prompt_files(tmp_path, tiny_models):
    model = tiny_models("llama", "Q4_0")
    cases = [("p.txt", b"\xff\xfebad\n", "not UTF-8"),
             ("p.jsonl", b'{"prompt": 5}\n', 'p.jsonl:1: not a JSON object with a "prompt" string'),
             ("q.jsonl", b"[1, 2]\n", 'q.jsonl:1: not a JSON object with a "prompt" string'),
             ("e.jsonl", b'{"prompt": "hi"}\n{"prompt": ""}\n', "prompt 2 ('') is empty after tokenization")]
    for name, data, needle in cases:
        (tmp_path / name).write_bytes(data)
        r = memra_cli("spec-check", model, "--device", "cpu", "--prompts", tmp_path / name, "--k", "1",
                      "--greedy-only", "-n", "2")
        one_error_line(r, needle)
        assert r.stdout == ""


def test_serve_bad_flags_fail_before_serving(tmp_path, tiny_models):
    model = tiny_models("llama", "Q4_0")
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"\xff\xfe key\n")
    for extra, needle in [(["--port", "70000"], "127.0.0.1:70000: a port is 0..65535"),
                          (["--port", "-1"], "a port is 0..65535"),
                          (["--parallel", "0"], "--parallel must be at least 1, got 0"),
                          (["--ctx-size", "0"], "--ctx-size must be a positive token count, got 0"),
                          (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be at least 1"),
                          (["--drain-timeout", "nan"], "--drain-timeout must be >= 0, got nan"),
                          (["--api-key-file", keys], "keys.txt: not UTF-8 text")]:
        # before the fixes: tracebacks, and 0 (or nan) silently served with the default
        one_error_line(memra_cli("serve", model, "--device", "cpu", *extra, timeout=60), needle)


def test_tune_dispatch_bad_rows_and_ops(tiny_models):
    model = tiny_models("llama", "Q4_0")
    base = ["tune", "dispatch", "-m", model, "--dry-run"]
    one_error_line(memra_cli(*base, "--rows", "abc"), "--rows takes row counts", "'abc'")  # was a ValueError
    one_error_line(memra_cli(*base, "--rows", ","), "--rows: no row counts")                # was "0 jobs", exit 0
    one_error_line(memra_cli(*base, "--ops", "qkv,nosuch"), "--ops: no op 'nosuch'", "attn_output")


def test_tune_freeze_bad_min_gain_and_out_dir(tmp_path):
    from test_tuning import _write, rec

    receipts = _write(tmp_path, [rec(2.0)])
    base = ["tune", "freeze", receipts, "--out-dir", tmp_path / "tables"]
    for v in ("nan", "-1"):  # were taken: nan keeps no built-in configuration, -1 none either
        one_error_line(memra_cli(*base, "--min-gain", v), "--min-gain must be a fraction >= 0", v)
    one_error_line(memra_cli("tune", "freeze", receipts, "--out-dir", receipts), "r.jsonl is not a folder")
    one_error_line(memra_cli(*base, "--stand-in", "NVIDIA H100 80GB HBM3"), "--stand-in needs --device")
    one_error_line(memra_cli(*base, "--device", "NVIDIA H200", "--stand-in", "RTX 5090"), "'RTX 5090': no receipts")
    assert memra_cli(*base).returncode == 0 and (tmp_path / "tables" / "nvidia-h200.json").is_file()


def test_research_board_and_parquet_bad_paths(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"\xff\xfe <!-- board: newest -->\n")
    one_error_line(memra_cli("research", "board", tmp_path / "missing.md", "--research", tmp_path, "--check"),
                   "missing.md: cannot read (No such file or directory)")
    one_error_line(memra_cli("research", "board", bad, "--research", tmp_path, "--check"), "bad.md: not UTF-8 text")
    receipts = tmp_path / "r.jsonl"
    receipts.write_text('{"kind": "note", "x": 1}\n')
    one_error_line(memra_cli("research", "summarize", receipts, "--parquet", tmp_path),
                   str(tmp_path), "cannot write Parquet")


def test_tune_campaign_not_utf8(tmp_path):
    c = tmp_path / "c.toml"
    c.write_bytes(b'name = "\xff"\n')
    one_error_line(memra_cli("tune", "run", c, "--dry-run"), "c.toml: not UTF-8 text")


def test_an_empty_model_name_is_not_the_default_model(tmp_path):
    # '' (say an unset shell variable) used to run, tokenize or describe smollm2-135m silently
    for args in (["run", "", "-p", "hi", "-n", "1", "--device", "cpu"], ["info", ""], ["tokenize", "", "-t", "hi"],
                 ["synth", tmp_path / "x.gguf", "--tokenizer-from", ""]):
        r = memra_cli(*args)
        one_error_line(r, "the model name is empty")
        assert r.stdout == ""


def test_bench_serve_bad_flags_fail_before_any_run(tmp_path, tiny_models):
    base = ["bench", "serve", "http://127.0.0.1:1"]  # nothing listens on port 1
    for extra, needle in [(["-c", "abc"], "-c takes request counts >= 1 (e.g. 1,8,32), got 'abc'"),  # ValueError
                          (["--requests", "0"], "--requests must be at least 1, got 0"),  # was the default
                          (["--requests", "-1"], "--requests must be at least 1, got -1"),  # "prompt_tokens is nan"
                          (["--timeout", "0"], "--timeout must be a positive number of seconds"),
                          (["--timeout", "-1"], "--timeout must be a positive number of seconds"),
                          (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
                          (["--out", tmp_path], f"--out {tmp_path} is a folder"),  # was after the whole run
                          ([], "http://127.0.0.1:1: no server answered (ConnectError")]:  # was an internal error
        one_error_line(memra_cli(*base, *extra, timeout=60), needle)
    # --vs and --out are checked before the server of a MODEL is started (that took minutes first)
    for extra, needle in [(["--vs", "notaurl"], "'notaurl' is not an http URL"),
                          (["--out", tmp_path], "is a folder")]:
        one_error_line(memra_cli("bench", "serve", tiny_models("llama", "Q4_0"), "--device", "cpu", *extra, timeout=60),
                       needle)


def test_memra_home_that_is_a_file(tmp_path):
    f = tmp_path / "home"
    f.write_text("")
    for home, needle in [(f, f"MEMRA_HOME={f} is not a folder"), (f / "sub", f"MEMRA_HOME={f / 'sub'}: {f} is not a folder")]:
        # were NotADirectoryError internal errors (making models/ inside it)
        for args in (["info", "smollm2-135m"], ["synth", tmp_path / "x.gguf"]):
            one_error_line(memra_cli(*args, env={"MEMRA_HOME": str(home)}), needle)
    assert not (tmp_path / "x.gguf").exists()


def test_an_empty_device_is_not_the_default_device(tmp_path, tiny_models):
    model = tiny_models("llama", "Q4_0")
    # '' ran on the default device where 'tpu' was refused
    for args in (["run", model, "-p", "hi", "-n", "1"], ["serve", model], ["spec-check", model, "--k", "1", "-n", "2"],
                 ["bench", "serve", model]):
        r = memra_cli(*args, "--device", "", timeout=60)
        one_error_line(r, "--device must be cpu or gpu, got ''")
        assert r.stdout == ""


def test_tune_run_unknown_type_variant_kernel_and_reps(tmp_path):
    shape = '{ type = "Q4_0", rows = 64, cols = 64 }'
    cases = [("t", "matvec", "q8", '{ type = "NOPE", rows = 64, cols = 64 }', "unknown tensor type 'NOPE'"),
             ("v", "matvec", "q9", shape, "kernel matvec has no variant 'q9' (its variants: q8, f32)"),
             ("k", "matvecc", "q8", shape, "matvec.cu measures no kernel 'matvecc'")]
    for name, kernel, variant, s, needle in cases:  # were listed by --dry-run, exit 0
        c = tmp_path / f"{name}.toml"
        c.write_text(f'[[kernels]]\nname = "{kernel}"\nsrc = "matvec.cu"\nvariants = ["{variant}"]\nshapes = [{s}]\n')
        r = memra_cli("tune", "run", c, "--dry-run")
        one_error_line(r, needle)
        assert r.stdout == ""
    for reps in ("0", "-1"):  # were accepted
        one_error_line(memra_cli("tune", "run", tmp_path / "t.toml", "--dry-run", "--reps", reps),
                       f"--reps must be at least 1, got {reps}")
    c = tmp_path / "r.toml"
    c.write_text(f'reps = 0\n[[kernels]]\nname = "matvec"\nvariants = ["q8"]\nshapes = [{shape}]\n')
    one_error_line(memra_cli("tune", "run", c, "--dry-run"), "reps must be a positive integer, got 0")


def test_tune_show_dir_that_is_not_a_folder(tmp_path):
    # a missing folder printed "stale: none" and exit 0
    one_error_line(memra_cli("tune", "show", "--dir", tmp_path / "missing"), "missing: no such folder")
    f = tmp_path / "t.json"
    f.write_text("{}")
    one_error_line(memra_cli("tune", "show", "--dir", f, "--json"), "t.json: not a folder")


def test_empty_list_options_are_not_the_default(tmp_path, tiny_models):
    # each '' (say an unset shell variable) silently meant the default: every target, column, kernel or op
    receipts = tmp_path / "r.jsonl"
    receipts.write_text('{"kind": "note", "x": 1}\n')
    campaign = tmp_path / "c.toml"
    campaign.write_text('[[kernels]]\nname = "matvec"\nvariants = ["q8"]\nshapes = [{ type = "Q4_0", rows = 64, '
                        'cols = 64 }]\n')
    for args, needle in [(["kernel-check", "--compile-only", "--only", "act", "--arch", ""], "--arch: no targets"),
                         (["warmup", "--arch", ""], "--arch: no targets given"),
                         (["research", "summarize", receipts, "--by", ""], "--by: no columns given"),
                         (["research", "compare", receipts, receipts, "--on", ""], "--on: no columns given"),
                         (["tune", "run", campaign, "--dry-run", "--kernels", ""], "--kernels: no kernel names"),
                         (["tune", "dispatch", "-m", tiny_models("llama", "Q4_0"), "--dry-run", "--ops", ""],
                          "--ops: no op names given")]:
        r = memra_cli(*args)
        one_error_line(r, needle)
        assert r.stdout == ""


def test_synth_onto_something_not_a_file(tmp_path):
    # /dev/null took the model ("0 B", exit 0); with --tokenizer-only the rename of the temporary
    # file replaced the device with a regular file. A named pipe stands in for it here.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for extra in (["--tokenizer-only"], []):
        one_error_line(memra_cli("synth", fifo, *extra, timeout=60), f"{fifo} is a named pipe, not a file")
        assert fifo.is_fifo()


def test_spec_k_range_and_spec_flags_without_spec(tiny_models):
    model = tiny_models("llama", "Q4_0")
    for v in ("abc", "40"):  # 'abc' said 1..8 where 1..32 is taken
        one_error_line(memra_cli("run", model, "-p", "hi", "-n", "1", "--device", "cpu", "--spec", "lookup",
                                 "--spec-k", v), "--spec-k must be auto or a draft length 1..32")
    # were silently ignored without --spec
    r = memra_cli("run", model, "-p", "hi", "-n", "1", "--device", "cpu", "--spec-k", "3")
    one_error_line(r, "--spec-k tunes speculative decoding: it needs --spec")
    assert r.stdout == ""
    for extra in (["--spec-k", "3"], ["--spec-max-batch", "4"]):
        one_error_line(memra_cli("serve", model, "--device", "cpu", *extra, timeout=60),
                       f"{extra[0]} tunes speculative decoding: it needs --spec")
    one_error_line(memra_cli("serve", model, "--device", "cpu", env={"MEMRA_SPEC_K": "3"}, timeout=60),
                   "--spec-k tunes speculative decoding: it needs --spec")


def test_serve_kv_cache_beyond_this_machine_is_refused_up_front(tiny_models):
    model = tiny_models("llama", "Q4_0")
    # each ended with "the engine failed to load: MemoryError" after the server had started
    for extra, needle in [(["--parallel", "100000000"], "lower --parallel (100000000) or --ctx-size"),
                          (["--ctx-size", "999999999999"], "lower --parallel (4) or --ctx-size (999999999999)"),
                          (["--kv-memory", "1000TiB"], "lower --kv-memory or --ctx-size")]:
        r = memra_cli("serve", model, "--device", "cpu", *extra, timeout=60)
        assert r.returncode == 1, r.stderr
        last = r.stderr.strip().split("\n")[-1]  # a context beyond the trained one is also warned about
        assert last.startswith("memra: error: ") and "GiB of KV cache on the CPU" in last and needle in last, last
        assert "loading" not in r.stderr and "MemoryError" not in r.stderr, r.stderr


@pytest.mark.slow
def test_bench_serve_stopped_by_sigterm_stops_its_server(tiny_models):
    """`timeout` (SIGTERM) on `memra bench serve MODEL` stops the `memra serve` it started: Python's
    default SIGTERM action ended the bench at once and left the server listening."""
    import re
    import signal
    import socket
    import time

    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "memra", "bench", "serve", str(tiny_models("llama", "Q4_0")),
                          "--device", "cpu", "-c", "1", "--requests", "200", "--max-tokens", "8"],
                         cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port, out = None, []
    try:
        for line in p.stdout:   # the server's command line, then the first cell once it is ready
            out.append(line)
            port = port or (re.search(r"--port (\d+)", line) and int(re.search(r"--port (\d+)", line).group(1)))
            if "concurrency 1" in line:
                break
        assert port, "".join(out)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()   # it listens
        p.send_signal(signal.SIGTERM)
        p.wait(90)
        for _ in range(60):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the server on port {port} still listens after the bench was stopped")
    finally:
        if p.poll() is None:
            p.kill()
