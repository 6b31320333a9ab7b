"""Records a real llama-server's monitoring answers for the serving tests (run by hand, not by the suite).

    python tests/data/serving/record.py --llama-server PATH --model GGUF [--out tests/data/serving/llamacpp]

It serves the model as `model.gguf` (a link in a temporary folder, so no path of the recording
machine is kept) with --metrics and two slots, and saves /health, /metrics, /slots and /props:
idle, while three requests run on two slots (one deferred), once they are done, and while a
request fills its slot's context."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

PORT = 18555
BASE = f"http://127.0.0.1:{PORT}"


def get(path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(BASE + path, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except urllib.error.URLError:
        return 0, b""  # not listening yet


def complete(body: dict) -> None:
    req = urllib.request.Request(BASE + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=300).read()


def save(out: Path, state: str) -> None:
    for name, path in (("health", "/health"), ("metrics", "/metrics"), ("slots", "/slots"), ("props", "/props")):
        status, body = get(path)
        suffix = "txt" if name == "metrics" else "json"
        (out / f"{state}.{name}.{suffix}").write_bytes(body)
        print(state, name, status, len(body))


def requests(bodies: list[dict]) -> list[threading.Thread]:
    threads = [threading.Thread(target=complete, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    return threads


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--llama-server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", default=str(Path(__file__).parent / "llamacpp"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.abspath(args.model), os.path.join(tmp, "model.gguf"))
        server = subprocess.Popen([args.llama_server, "-m", "model.gguf", "--host", "127.0.0.1", "--port", str(PORT),
                                   "--metrics", "-c", "512", "-np", "2", "-t", "2"], cwd=tmp,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while get("/health")[0] != 200:
                time.sleep(0.5)
            save(out, "idle")
            running = requests([{"prompt": "Once upon a time", "n_predict": 120}] * 3)
            time.sleep(1.5)
            save(out, "busy")
            for t in running:
                t.join()
            save(out, "done")
            running = requests([{"prompt": "Count: one two three", "n_predict": 1000}])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and running[0].is_alive():
                slots = json.loads(get("/slots")[1])
                busy = [s for s in slots if s.get("is_processing")]
                # In this build a slot's n_prompt_tokens counts its whole context: prompt and decoded.
                used = [s.get("n_prompt_tokens", 0) for s in busy]
                if used and max(used) >= 240:  # of the slot's 256
                    save(out, "ctx_near_full")
                    break
                time.sleep(0.05)
            running[0].join()
        finally:
            server.terminate()
            server.wait()
    print("version:", subprocess.run([args.llama_server, "--version"], capture_output=True, text=True).stderr.strip(),
          file=sys.stderr)


if __name__ == "__main__":
    main()
