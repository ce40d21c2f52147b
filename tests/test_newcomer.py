"""A new user's first hour (issue 15), run as a user runs memra: a subprocess from the
checkout or from another folder, with stderr a pipe or a terminal (a pty). Each test names
the point of the issue it holds to; the expected values come from outside the code under
test (model cards, hand-made receipts with known answers, the files on disk, git)."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import select
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memra.model import aliases

ROOT = Path(__file__).resolve().parent.parent
SMOL_N_CTX_TRAIN = 8192  # SmolLM2-135M's model card: trained with an 8192-token context


def env_for(env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("MEMRA_LOG", "COLUMNS", "LINES"):
        e.pop(k, None)
    e.update(env or {})
    return e


def memra(*args, cwd=ROOT, env=None, stdin=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "memra", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env_for(env), input=stdin, timeout=timeout)


def memra_in_pty(*args, env=None, timeout=600):
    """memra with stderr on a terminal (a pty); returns (rc, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "memra", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT,
                         env=env_for({"TERM": "xterm-256color", **(env or {})}))
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], timeout)
        if not r:
            p.kill()
            break
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = p.stdout.read().decode()
    p.wait(timeout=60)
    return p.returncode, out, b"".join(chunks).decode("utf-8", "replace")


def one_error_line(r, *needles):
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("memra: error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def smol_path():
    return aliases.resolve("smollm2-135m")


# -- 1. sampling flags are validated, in one place ----------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--temp", "-1"), ("--top-p", "2"), ("--top-k", "-5"), ("--min-p", "3"), ("--min-p", "-0.1"),
    ("--repeat-penalty", "0"), ("--presence-penalty", "nan"), ("--seed", "-1"), ("-n", "-2"),
    ("--ctx", "0"), ("--repeat-last-n", "-3"),
])
def test_run_refuses_out_of_range_flags(flag, value):
    # llama.cpp / OpenAI ranges: temperature >= 0, top_k >= 0, top_p and min_p in [0, 1],
    # repeat_penalty > 0, finite penalties, seed >= 0, n >= -1, a positive context.
    # In-process (the typer app as `memra` runs it) to keep eleven cases cheap; the
    # subprocess form is test_the_cli_and_the_library_share_one_validation's.
    from typer.testing import CliRunner

    from memra.cli import app

    r = CliRunner().invoke(app, ["run", "-p", "x", "--device", "cpu", flag, value])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memra: error: ") and flag in lines[0] and value in lines[0]


def test_the_cli_and_the_library_share_one_validation():
    from memra.errors import MemraError
    from memra.sampling import SamplingParams, check_request

    with pytest.raises(MemraError) as e:
        check_request(SamplingParams(top_p=2.0))
    r = memra("run", "-p", "x", "--device", "cpu", "--top-p", "2")
    # the same sentence, the field named as the server's request names it, or as the flag
    assert one_error_line(r) == "memra: error: " + str(e.value).replace("top_p", "--top-p")


@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_a_context_beyond_training_warns_and_runs():
    r = memra("run", "-p", "Hello", "-n", "1", "--temp", "0", "--device", "cpu", "--ctx", "100000")
    assert r.returncode == 0, r.stderr
    assert "--ctx 100000" in r.stderr and str(SMOL_N_CTX_TRAIN) in r.stderr
    r = memra("run", "-p", "Hello", "-n", "0", "--device", "cpu", "--ctx", "64")
    assert r.returncode == 0 and "trained on" not in r.stderr


# -- 2. a clean source tree ---------------------------------------------------------------------

def tree_state():
    """What git and the disk say about the tracked outputs' folders (tune/, research/)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "tune", "research"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = {str(p.relative_to(ROOT)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
             for p in sorted((ROOT / "tune" / "defaults").glob("*.json"))}
    return status, files


@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_tune_freeze_without_arguments_leaves_the_checkout_alone(tmp_path):
    home = tmp_path / "home"
    before = tree_state()
    for cwd in (ROOT, tmp_path):  # from the checkout and from elsewhere
        r = memra("tune", "freeze", "--json", cwd=cwd, env={"MEMRA_HOME": str(home)})
        assert r.returncode == 0, r.stderr
    assert tree_state() == before
    # made from the committed receipts (research/tune/: the H200's, and an H100's gemm_f16 campaign standing in
    # for it, as in the shipped table)
    mine = json.loads((home / "tables" / "nvidia-h200.json").read_text())
    assert mine["device"] == "NVIDIA H200" and mine["receipts"]
    assert {e.get("measured_on") for b in mine["entries"]["gemm_f16"].values() for e in b.values()} == {
        "NVIDIA H100 80GB HBM3"}
    # the H100's own table stands on the H200's receipts for everything it has no receipts of: none is lost
    h100 = json.loads((home / "tables" / "nvidia-h100-80gb-hbm3.json").read_text())
    keys = lambda t: {(k, s, b) for k, v in t["entries"].items() for s, bs in v.items() for b in bs}  # noqa: E731
    assert keys(h100) == keys(mine)
    assert {e.get("measured_on") for v in h100["entries"].values() for bs in v.values() for e in bs.values()} == {
        None, "NVIDIA H200"}
    # the engine finds it first (`memra tune show` lists it before the shipped one)
    doc = json.loads(memra("tune", "show", "--json", env={"MEMRA_HOME": str(home),
                                                          "CUDA_VISIBLE_DEVICES": ""}).stdout)
    h200 = [Path(t["path"]) for t in doc["tables"] if Path(t["path"]).name == "nvidia-h200.json"]
    assert h200 == [home / "tables" / "nvidia-h200.json", ROOT / "tune" / "defaults" / "nvidia-h200.json"]


def test_bench_and_tune_receipts_default_to_memra_home(tmp_path, monkeypatch):
    from memra import paths
    from memra.tune import bench as B

    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))
    out = B.default_out("NVIDIA H200")
    assert out.parent == tmp_path / "receipts" and out.name.startswith("bench-nvidia-h200-")
    assert paths.tune_out_dir() == tmp_path / "receipts" / "tune"
    assert paths.home_tables_dir() == tmp_path / "tables" and paths.plots_dir() == tmp_path / "plots"


# -- 3. every receipt kind reads back; summarize / compare on whole folders -----------------------

def _lines(folder: Path):
    for f in sorted(folder.rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_summarize_reads_every_receipt_under_research():
    rows = list(_lines(ROOT / "research"))
    bench = [x for x in rows if x.get("kind") == "bench" and x.get("schema") == 1]
    assert bench, "research/ holds memra bench receipts"
    r = memra("research", "summarize", "research/", "--json")
    assert r.returncode == 0, r.stderr
    assert "skipped" not in r.stderr
    summary = json.loads(r.stdout)
    assert sum(x["n"] for x in summary) == len(rows)
    assert sum(x["n"] for x in summary if x["kind"] == "bench") == len(bench)
    assert {x["kind"] for x in summary} >= {"bench", "tune", "record"}
    r = memra("research", "summarize", "research/")  # the tables, one per kind
    assert r.returncode == 0 and "bench:" in r.stdout and "tune:" in r.stdout


def _bench_line(median: float, model: str = "m", engine: str = "memra", date: str = "2026-12-01T00:00:00Z",
                sha: str = "aaaaaaa", test: str = "tg128", **extra) -> dict:
    # the fields `memra bench` writes (docs/FLAGS.md), values made up with known answers
    return {"kind": "bench", "schema": 1, "engine": engine, "model": model, "model_file": "m.gguf",
            "test": test, "n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": median, "median_ts": median,
            "stddev_ts": 0.5, "samples_ts": [median - 0.5, median, median + 0.5], "bytes_per_token": 1000,
            "gbps": 1.0, "pct_bw": 25.0, "bw_gbps": 4.0, "device": "NVIDIA H200", "cc": "9.0", "sms": 132,
            "git_sha": sha, "date": date, "gate": "MATCH" if engine == "memra" else None, "tag": None,
            "model_size": 10, **extra}


def _tune_line():
    from memra.tune.receipts import make_receipt

    return make_receipt(kernel="matvec", variant="q8", config={"MV_NWARPS": 4}, shape={"type": "Q4_0", "batch": 1},
                        src="matvec.cu", src_hash="h", device="NVIDIA H200", cc="9.0", sms=132, nvrtc="13.0",
                        ok=True, median_us=2.0, p20_us=2.0, p80_us=2.0, reps=3, bytes=2000)


@pytest.mark.slow
def test_a_folder_of_mixed_receipts_logs_and_a_bad_line(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps(_bench_line(100.0)) + "\n{not json\n" + json.dumps(_tune_line()) + "\n")
    (d / "notes.md").write_text("# notes\n")
    (d / "session.log").write_text("kernel-check: ALL GREEN\n")
    r = memra("research", "summarize", str(d), "--json")
    assert r.returncode == 0, r.stderr
    assert f"{d / 'a.jsonl'}:2" in r.stderr and "Traceback" not in r.stderr
    got = {x["kind"]: x["n"] for x in json.loads(r.stdout)}
    assert got == {"bench": 1, "tune": 1}
    r = memra("research", "summarize", str(d / "a.jsonl"), str(d / "session.log"), "--json")
    assert r.returncode == 0 and "session.log" in r.stderr


def test_compare_bench_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x.jsonl").write_text(json.dumps(_bench_line(100.0)) + "\n" + json.dumps(_bench_line(40.0, model="n")) + "\n")
    (b / "y.jsonl").write_text(json.dumps(_bench_line(150.0)) + "\n" + json.dumps(_tune_line()) + "\n")
    r = memra("research", "compare", str(a), str(b), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # t/s: higher is better, so B's 150 against A's 100 is a speedup of 1.5
    assert [(x["kind"], x["model"], x["speedup"]) for x in doc["rows"]] == [("bench", "m", 1.5)]
    assert doc["only_a"] == 1 and doc["only_b"] == 0


# -- 4. progress on slow steps, load time and TTFT ----------------------------------------------

@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_stats_line_and_json_carry_load_time_and_ttft():
    r = memra("run", "-p", "The capital of France is", "-n", "3", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    m = re.search(r"cpu: load (\d+\.\d+) s · TTFT (\d+\.\d+) s · prefill", r.stderr)
    assert m, r.stderr
    r = memra("run", "-p", "The capital of France is", "-n", "3", "--temp", "0", "--device", "cpu", "--json")
    doc = json.loads(r.stdout)
    # TTFT spans the prompt's forward pass and the first sample: at least the prefill time
    assert doc["load_s"] > 0 and doc["ttft_s"] >= doc["prefill_s"] > 0


BAR = re.compile(r"\d+/\d+ tokens")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_prefill_progress_on_a_terminal_only():
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 3)
    rc, out, term = memra_in_pty("run", "-p", prompt, "-n", "2", "--temp", "0", "--device", "cpu")
    assert rc == 0, term
    term = ANSI.sub("", term)
    assert BAR.search(term), term[-2000:]  # e.g. "prefill ━━━━ 120/120 tokens 0:00:01"
    r = memra("run", "-p", prompt, "-n", "2", "--temp", "0", "--device", "cpu")
    assert r.returncode == 0 and not BAR.search(r.stderr) and "\x1b[" not in r.stderr


def _wheel(folder: Path, payload: bytes) -> Path:
    """A minimal wheel holding one file (a stand-in for a model package on PyPI)."""
    w = folder / "memrafakemodel-0.1-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("memrafakemodel/model.gguf", payload)
        z.writestr("memrafakemodel-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: memrafakemodel\nVersion: 0.1\n")
        z.writestr("memrafakemodel-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                          "Tag: py3-none-any\n")
        z.writestr("memrafakemodel-0.1.dist-info/RECORD", "")
    return w


@pytest.mark.parametrize("progress", [False, True])
def test_download_shows_pip_progress_only_when_asked(tmp_path, monkeypatch, capfd, progress):
    payload = os.urandom(50_000)
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, payload)
    fake = aliases.Alias("fake", "fake.gguf", hashlib.sha256(payload).hexdigest(), ("memrafakemodel==0.1",),
                         ("memrafakemodel/model.gguf",), "a fake model")
    monkeypatch.setitem(aliases.ALIASES, "fake", fake)
    monkeypatch.setenv("MEMRA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    path = aliases.pull("fake", progress=progress)
    assert path.read_bytes() == payload
    captured = capfd.readouterr()
    assert captured.out == ""  # stdout stays memra's data
    if progress:
        assert "memrafakemodel" in captured.err  # pip's own lines: what it fetches, and how far
    else:
        assert captured.err == ""


def test_gpu_load_counts_kernel_compiles_on_the_terminals_status_line(tmp_path, monkeypatch):
    from memra.cli.run import _compile_progress
    from memra.gpu.compile import compile_cubin
    from memra.gpu.ops import act

    monkeypatch.setenv("MEMRA_HOME", str(tmp_path))  # an empty cubin cache: NVRTC runs
    texts = []

    class Status:  # rich's Status, as `memra run` holds it while the engine loads
        def update(self, text):
            texts.append(text)

    kernel_file, defines = act.compile_variants()[0]
    with _compile_progress(Status(), "loading m on gpu…"):
        compile_cubin(kernel_file, "sm_89", defines)
        compile_cubin(kernel_file, "sm_89", defines)  # a cache hit: not counted
    assert texts == ["loading m on gpu… compiling kernels with NVRTC: 1 (first run on this machine; "
                     "`memra warmup` does it ahead)"]


# -- 5. memra synth with its defaults -------------------------------------------------------------

def test_synth_with_its_defaults_and_an_unknown_arch(tmp_path):
    from memra.model.config import read_config
    from memra.model.gguf import open_gguf

    r = memra("synth", tmp_path / "x.gguf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    g = open_gguf(tmp_path / "x.gguf")
    assert g.arch == "llama" and read_config(g).n_layer >= 1  # --arch defaults to the tiny shape's llama
    g.close()
    line = one_error_line(memra("synth", tmp_path / "y.gguf", "--arch", "mamba"), "architecture 'mamba'")
    assert "shape" not in line and not (tmp_path / "y.gguf").exists()


# -- 6. tables off a terminal ----------------------------------------------------------------------

@pytest.mark.slow
def test_tables_keep_their_width_off_a_terminal(tmp_path):
    d = tmp_path / "tables"
    d.mkdir()
    table = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())
    (d / "nvidia-h200.json").write_text(json.dumps(table))
    r = memra("tune", "show", "--dir", d, env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    n = 0
    for kernel, shapes in table["entries"].items():
        for skey, by_batch in shapes.items():
            for e in by_batch.values():
                cfg = ",".join(f"{k}={v}" for k, v in sorted(e["config"].items()))
                # each entry is one row: its kernel, whole shape and whole configuration on one line
                assert any(kernel in l and skey in l and cfg in l for l in lines), (kernel, skey, cfg)
                n += 1
    assert n > 10
    r = memra("research", "summarize", "research/")
    assert any("synthetic llama3-8b Q4_K_M" in l and "tg128" in l for l in r.stdout.splitlines())


# -- 7. chat on a base model -----------------------------------------------------------------------

@pytest.mark.slow
def test_chat_on_a_model_without_a_template_warns():
    # Gemma-3-270M's GGUF carries no tokenizer.chat_template (test_cli checks it with the gguf package)
    r = memra("run", "gemma3-270m", "--chat", "-p", "Hi", "-n", "0", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "no chat template" in r.stderr
    r = memra("run", "smollm2-135m", "--chat", "-p", "Hi", "-n", "0", "--device", "cpu")
    assert r.returncode == 0 and "no chat template" not in r.stderr
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"`gemma3-270m`[^|]*?base model", readme, re.S), "README says which alias is a base model"


# -- 8. the docs name only what exists -------------------------------------------------------------

DEFAULTS: dict[tuple[str, ...], str] = {}  # a group's default subcommand (`memra tune CAMPAIGN` = `tune run`)


def _default_sub(group) -> str | None:
    """The subcommand a group runs for words that name none of its commands, asked of the
    group itself (its parse_args puts the default's name first)."""
    import click

    ctx = click.Context(group, info_name="probe")
    try:
        group.parse_args(ctx, ["__not_a_command__"])
    except click.ClickException:
        return None
    args = list(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or []) + list(ctx.args)
    return args[0] if args and args[0] in group.commands else None


def cli_tree():
    """{('run',): {'--prompt', '-p', ...}, ('tune', 'freeze'): {...}, ...} walked from the typer app."""
    import typer

    from memra.cli import app

    out = {}

    def walk(cmd, path):
        opts = {"--help"}
        for p in cmd.params:
            opts.update(getattr(p, "opts", []))
            opts.update(getattr(p, "secondary_opts", []))
        out[path] = opts
        subs = getattr(cmd, "commands", {})
        if path and subs and _default_sub(cmd):
            DEFAULTS[path] = _default_sub(cmd)
        for name, sub in subs.items():
            walk(sub, path + (name,))

    walk(typer.main.get_command(app), ())
    return out


def _commands_of(words: list[str], tree) -> tuple[list[tuple[str, ...]], int]:
    """The command paths the leading words spell (a word may list alternatives, a|b), and how
    many words they take. A group with a default subcommand given other words runs that
    subcommand: `memra tune CAMPAIGN` is `memra tune run CAMPAIGN`."""
    paths, used = [()], 0
    for w in words:
        alts = [a for a in re.split(r"\\?\|", w) if a]
        nxt = [p + (a,) for p in paths for a in alts if p + (a,) in tree]
        if not nxt:
            break
        paths, used = nxt, used + 1
    if len(paths) == 1 and paths[0] in DEFAULTS and (used == len(words) or words[used] not in
                                                      {p[-1] for p in tree if p[:-1] == paths[0]}):
        paths = [paths[0] + (DEFAULTS[paths[0]],)]  # `memra tune CAMPAIGN`, `memra bench MODEL`
    return paths, used


SPAN = re.compile(r"`(memra [^`]+)`")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def test_every_command_and_flag_in_the_docs_exists():
    tree = cli_tree()
    problems = []
    for doc in ("README.md", "docs/FLAGS.md"):
        for span in SPAN.findall((ROOT / doc).read_text()):
            words = span.split()[1:]
            paths, used = _commands_of(words, tree)
            if used == 0 and words and not words[0].startswith("-"):
                problems.append(f"{doc}: `{span}`: no command {words[0]!r}")
                continue
            for path in paths:
                for flag in FLAG.findall(" ".join(words[used:])):
                    if flag not in tree[path] and not (path == () and flag == "--version"):
                        problems.append(f"{doc}: `{span}`: memra {' '.join(path)} has no {flag}")
    # FLAGS.md's tables: a section's flag column belongs to the section's command; in the
    # `memra tune …` and `memra research …` section a first column names the command
    section = row_cmd = None
    for line in (ROOT / "docs" / "FLAGS.md").read_text().splitlines():
        m = re.match(r"## `memra ([^`]+)`", line)
        if line.startswith("## "):
            section = _commands_of(m.group(1).split(), tree)[0][0] if m else None
            if m and m.group(1).startswith("tune …"):  # a table whose first column names the command
                section = ("tune",)
            row_cmd = None
            continue
        if section is None or not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if section == ("tune",):
            if cells[0] and cells[0] != "command":
                words = cells[0].strip("`").split()
                paths, used = _commands_of(words, tree)
                if not used:
                    problems.append(f"FLAGS.md: no command memra {cells[0]}")
                row_cmd = paths[0] if used else None
            cmd, flag_cell = row_cmd, cells[1] if len(cells) > 1 else ""
        else:
            cmd, flag_cell = section, cells[0]
        if cmd is None or flag_cell in ("flag", "variable"):
            continue
        for flag in FLAG.findall(flag_cell.replace("`", " ")):
            if flag not in tree[cmd]:
                problems.append(f"FLAGS.md: memra {' '.join(cmd)} has no {flag}")
    assert not problems, "\n".join(problems)


def test_run_json_fields_are_documented():
    r = memra("run", "-p", "Hi", "-n", "1", "--temp", "0", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    row = next(l for l in (ROOT / "docs" / "FLAGS.md").read_text().splitlines() if l.startswith("| `--json` | off | Print one JSON object"))
    missing = [k for k in json.loads(r.stdout) if f"`{k}`" not in row]
    assert not missing, missing


def test_flags_md_points_at_files_that_exist():
    text = (ROOT / "docs" / "FLAGS.md").read_text()
    assert "DESIGN.md" not in text  # not part of this repository
    for path in re.findall(r"`((?:research|tune|docs|experiments)/[^`*<> ]+)`", text):
        assert (ROOT / path).exists(), path


def test_campaign_comments_match_the_tune_hooks():
    # memra/tune/measure.py finds a family's hooks in memra/gpu/ops/<kernel file stem>.py
    for f in (ROOT / "tune" / "campaigns").glob("*.toml"):
        for m in re.finditer(r"(\w+)\.cu has no tune hook", f.read_text()):
            mod = __import__(f"memra.gpu.ops.{m.group(1)}", fromlist=["x"])
            assert not hasattr(mod, "tune_case"), f"{f.name}: {m.group(1)}.cu has a tune hook (tune_case)"


# -- 9. smaller points -------------------------------------------------------------------------------

@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_compile_only_ends_without_a_canary_count():
    # the machine's cubin cache (test_compile's kernel-check fills it): the ending is what counts here
    r = memra("kernel-check", "--compile-only", "--only", "act", "--arch", "sm_89")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("ALL GREEN") and "0 canaries" not in last and "compiled" in last


def test_a_folder_given_as_the_model(tmp_path):
    one_error_line(memra("info", tmp_path), str(tmp_path), "folder")
    one_error_line(memra("run", tmp_path, "-p", "x", "--device", "cpu"), "folder")


def test_a_bad_memra_log_is_reported(smol_path):
    r = memra("info", smol_path, "--json", env={"MEMRA_LOG": "bogus"})
    assert r.returncode == 0 and "MEMRA_LOG=bogus" in r.stderr
    json.loads(r.stdout)


@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_threads_flag():
    base = ["run", "-p", "Once upon a time", "-n", "2", "--temp", "0", "--device", "cpu", "--json"]
    one, two = memra(*base, "-t", "1"), memra(*base, "--threads", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert json.loads(one.stdout)["tokens"] == json.loads(two.stdout)["tokens"]  # threads never change tokens
    one_error_line(memra("run", "-p", "x", "--device", "cpu", "-t", "0"), "--threads")


def test_readme_says_what_the_tests_need():
    readme = (ROOT / "README.md").read_text()
    assert "1.6 GB" in readme and "MEMRA_HOME" in readme and "minutes" in readme


# -- 10. the tokenizer-only GGUF that synthetic models copy ---------------------------------------

@pytest.mark.slow  # a CLI subprocess of 4-7 s: the default run stays under 5 minutes
def test_tokenizer_only_gguf_makes_the_same_synthetic_models(tmp_path):
    tok = tmp_path / "smollm2-tokenizer.gguf"
    r = memra("synth", tok, "--tokenizer-only", "--tokenizer-from", "smollm2-135m")
    assert r.returncode == 0, r.stderr
    assert 1e5 < tok.stat().st_size < 5e6  # a tokenizer, not a model
    a = memra("synth", tmp_path / "a.gguf", "--tokenizer-from", tok, "--seed", "3")
    b = memra("synth", tmp_path / "b.gguf", "--seed", "3")  # from the alias itself
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    # the device scripts make it with the same command when it was not carried
    made = tmp_path / "x" / "tok.gguf"
    subprocess.run(["bash", "-c", f"source experiments/h200_common.sh && synthtok {made}"], cwd=ROOT,
                   env=env_for(), check=True, timeout=300)
    assert made.read_bytes() == tok.read_bytes()


# -- 11. warmup: compile what a model needs, once ----------------------------------------------------

def test_warmup_compiles_a_models_kernels_into_the_cache(smol_path):
    from gguf.constants import GGMLQuantizationType

    from memra.gpu.compile import cubin_path
    from memra.model.gguf import open_gguf

    # the machine's own cubin cache ($MEMRA_HOME/cubin), shared with kernel-check --compile-only
    env = {"CUDA_VISIBLE_DEVICES": ""}
    r = memra("warmup", smol_path, "--arch", "sm_89", "--json", env=env)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert rows and all(x["arch"] == "sm_89" and x["error"] is None for x in rows)
    g = open_gguf(smol_path)
    types = {int(GGMLQuantizationType[t.type_name]) for t in g.tensors.values() if len(t.shape) == 2}
    g.close()
    mv = {x["defines"]["MV_TYPE"] for x in rows if "MV_TYPE" in x["defines"]}
    assert mv and mv <= types  # matvec modules for the model's weight types only
    # the families SmolLM2's launch plan runs (no act_mul: gate and up share a type, so the
    # activation is inside the matvec; no softcap), attention at its head size; the vocabulary
    # mask a constrained request's rows run before the sampler; mvt at 2..15 rows, the GEMM from 16
    assert {x["family"] for x in rows} == {"matvec", "norm", "embed", "sample", "rope", "attention", "attn_fa",
                                           "gemm", "mask", "mvt"}
    assert {x["defines"]["HEAD_DIM"] for x in rows if x["family"] == "attention"} == {64}
    for x in rows:  # each one in the cache, an ELF cubin
        assert cubin_path(x["file"], "sm_89", x["defines"]).read_bytes()[:4] == b"\x7fELF"
    r = memra("warmup", smol_path, "--arch", "sm_89", env=env)  # the second time: nothing to compile
    assert r.returncode == 0 and f"0 compiled, {len(rows)} already cached" in r.stderr


# -- 12. the performance board ------------------------------------------------------------------

def test_board_check_passes_on_the_committed_docs():
    r = memra("research", "board", "--check")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_board_picks_the_newest_run_with_both_arms(tmp_path):
    research = tmp_path / "research"
    research.mkdir()
    lines = [
        # run 1 (older): both arms for model "big"
        _bench_line(200.0, model="big", sha="1111111", date="2026-12-01T10:00:00Z", model_size=100),
        _bench_line(100.0, model="big", engine="llama.cpp", sha="1111111", date="2026-12-01T10:00:05Z", model_size=100),
        # run 2 (newer): memra alone for "big"; memra alone for "small"
        _bench_line(300.0, model="big", sha="2222222", date="2026-12-02T10:00:00Z", model_size=100),
        _bench_line(50.0, model="small", sha="2222222", date="2026-12-02T10:01:00Z", model_size=1),
        # run 3 (newest): a rollback seam set: not on the board
        _bench_line(999.0, model="small", sha="3333333", date="2026-12-03T10:00:00Z", model_size=1,
                    seams={"MEMRA_FUSED_ROPE": "0"}),
        # run 4 (newest): a q8_0 KV cache (a runtime choice): not on the board either
        _bench_line(888.0, model="small", sha="4444444", date="2026-12-04T10:00:00Z", model_size=1,
                    cache_type_k="q8_0", cache_type_v="q8_0"),
        # run 5 (newest): a tuning table given as an experiment's file (an A/B arm): not either;
        # the committed default table named as a file is the default engine
        _bench_line(777.0, model="small", sha="5555555", date="2026-12-05T10:00:00Z", model_size=1,
                    table="file:/tmp/arm/table-after.json"),
        # run 6: both arms for "big", made with MEMRA_ATTN=hybrid set when it was not yet the
        # default: today's default engine, so on the board; run 7 (newest): MEMRA_ATTN=decode
        # set, a path other than today's default: not on the board
        _bench_line(400.0, model="big", sha="6666666", date="2026-12-06T10:00:00Z", model_size=100,
                    seams={"MEMRA_ATTN": "hybrid"}),
        _bench_line(100.0, model="big", engine="llama.cpp", sha="6666666", date="2026-12-06T10:00:05Z",
                    model_size=100),
        _bench_line(555.0, model="big", sha="7777777", date="2026-12-07T10:00:00Z", model_size=100,
                    seams={"MEMRA_ATTN": "decode"}),
        _bench_line(100.0, model="big", engine="llama.cpp", sha="7777777", date="2026-12-07T10:00:05Z",
                    model_size=100),
        # run 8 (newest): a working tree labelled as an experiment's (a held-back table applied for the
        # run, MEMRA_GIT_SHA=<sha>+<label>): not on the board
        _bench_line(654.0, model="small", sha="8888888+held-table", date="2026-12-08T10:00:00Z", model_size=1),
    ]
    (research / "bench.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = tmp_path / "PERF.md"
    doc.write_text("# prose kept\n\n<!-- board: newest -->\nold table\n<!-- /board -->\n\nmore prose\n")
    r = memra("research", "board", doc, "--research", research, "--check")
    assert r.returncode == 1 and "differ" in r.stderr
    r = memra("research", "board", doc, "--research", research)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert text.startswith("# prose kept\n") and text.endswith("<!-- /board -->\n\nmore prose\n")
    rows = [l for l in text.splitlines() if l.startswith("| big") or l.startswith("| small")]
    big, small = rows
    assert "| 400.0 ± 0.5 (3) |" in big and "| 100.0 (3) |" in big and "| 4.00x |" in big and "6666666" in big
    assert "| 50.0 ± 0.5 (3) |" in small and "not in the run" in small and "2222222" in small
    assert "999" not in text and "888" not in text and "777" not in text and "555" not in text and "654" not in text
    assert memra("research", "board", doc, "--research", research, "--check").returncode == 0


def test_bench_knows_every_rollback_seam_of_the_flags_doc(monkeypatch):
    """docs/FLAGS.md's rollback seams (env flags) with their defaults are exactly
    memra.tune.bench.SEAMS, so a run made with any of them set carries it in its receipts'
    `seams` and the boards leave it off (a seam added to the docs but not here would let a
    rolled-back run pass as the default engine)."""
    from memra.tune import bench as TB

    doc = {}
    for line in (ROOT / "docs" / "FLAGS.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1] == "rollback seam" and cells[0].startswith("`MEMRA_"):
            doc[cells[0].strip("`")] = cells[2].strip("`")
    assert doc == TB.SEAMS
    for k in (*TB.SEAMS, *TB.ENGINE_PATHS):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MEMRA_MVT", "0")
    assert TB.seams() == {"MEMRA_MVT": "0"}
