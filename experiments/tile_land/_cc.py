import io, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
def compile_module(src, defs):
    from cuda.core import Program, ProgramOptions
    src = Path(src)
    opts = ProgramOptions(name=src.name, arch="sm_90a", std="c++17", lineinfo=True,
                          include_path=[str(ROOT / "kernels"), str(src.parent)],
                          define_macro=[(k, str(v)) for k, v in sorted(defs.items())] or None,
                          ptxas_options=["-v"])
    log = io.StringIO()
    obj = Program(src.read_text(), "c++", opts).compile("cubin", logs=log)
    return bytes(obj.code), log.getvalue()
if __name__ == "__main__":
    d = dict(a.split("=") for a in sys.argv[2:])
    t = time.time()
    cub, log = compile_module(sys.argv[1], d)
    print(log[-3000:]); print(time.time() - t, "s")
