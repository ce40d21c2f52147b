"""Pack real GGUF models for the device machine in as few calls as its 64 MiB limit allows.

Shows: SmolLM2-135M (98 MB) and Gemma-3-270M (253 MB) travel in 6 calls instead of 7 by
cutting the concatenation of both files into equal chunks, the last one small enough to
travel with the wheels folder and the command that uses the models.

HERE:   python3 experiments/ship_models.py [CHUNK_MB]      -> .models/ship-NN/{part,take.sh}
DEVICE: one call per chunk, back to back:  bash .models/ship-NN/take.sh
        the last one reassembles /root/models/{smollm2,gemma3}.gguf and checks their sha256.
"""
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memra.model.aliases import ALIASES, pull  # noqa: E402

root = Path(__file__).resolve().parents[1]
chunk = int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 63_000_000
models = [("smollm2", pull("smollm2-135m")), ("gemma3", pull("gemma3-270m"))]
sums = {"smollm2": ALIASES["smollm2-135m"].sha256, "gemma3": ALIASES["gemma3-270m"].sha256}
blob = b"".join(p.read_bytes() for _, p in models)
sizes = [p.stat().st_size for _, p in models]
out = root / ".models"
for old in out.glob("ship-*"):
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
n = (len(blob) + chunk - 1) // chunk
layout, off = [], 0
for name, size in zip([m for m, _ in models], sizes):
    layout.append(f"{name} {off} {size} {sums[name]}")
    off += size
for k in range(n):
    d = out / f"ship-{k:02d}"
    d.mkdir(parents=True)
    (d / "part").write_bytes(blob[k * chunk:(k + 1) * chunk])
    (d / "take.sh").write_text(f"""#!/usr/bin/env bash
set -e; mkdir -p /root/models/ship; cp "$(dirname "$0")/part" /root/models/ship/p{k:02d}
if [ $(ls /root/models/ship | wc -l) = {n} ]; then
  cat /root/models/ship/p* > /root/models/ship.bin
  while read -r name off size sum; do
    tail -c +$((off + 1)) /root/models/ship.bin | head -c $size > /root/models/$name.gguf
    echo "$sum  /root/models/$name.gguf" | sha256sum -c -
  done <<'LAYOUT'
{chr(10).join(layout)}
LAYOUT
  rm -rf /root/models/ship /root/models/ship.bin
fi
""")
print(f"{n} chunks of <= {chunk / 1e6:.0f} MB in {out}/ship-NN; last {len(blob) - (n - 1) * chunk} bytes")
print(hashlib.sha256(blob).hexdigest()[:16])
