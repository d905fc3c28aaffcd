"""Measure llama-server (llama.cpp or ik_llama.cpp) on a CUDA GPU over sparse full-size layouts.

Run on a lent GPU machine (see scripts/gpu/ik-cuda.sh): for each case it writes the layout's sparse
GGUF (zero weights, the real model's shapes and types), starts llama-server, reads the buffer sizes
it logs, samples the card's used memory (NVML) through load and one completion of N prompt tokens
plus 32 generated, and records the server's own prompt and generation speeds. Results go to
OUT/results.json after every case (a run cut short keeps what it measured) and each log to OUT/logs/.

usage: python measure_server.py SERVER OUT DEADLINE_EPOCH CASE...   (CASE: name, see CASES)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

# name: (layout, engine flags, prompt tokens); a layout `NAME@N` keeps the first N blocks of NAME (every
# layer's real shapes and expert count: the loads stay short, the graph per layer is the model's)
CASES: dict[str, tuple[str, list[str], int]] = {
    "qwen3-30b-exps-cpu": ("qwen3-30b-a3b@12", ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"], 2048),
    "glm-air-exps-cpu": ("glm-4.5-air@12", ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"], 2048),
    "gpt-oss-20b-exps-cpu": ("gpt-oss-20b@12", ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"], 2048),
    "qwen3-30b-gpu": ("qwen3-30b-a3b@12", ["-ngl", "999", "-c", "32768"], 2048),
    "qwen3-30b-exps-cpu-ub2048": ("qwen3-30b-a3b@12", ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768",
                                                    "-b", "2048", "-ub", "2048"], 4096),
    "glm-air-exps-cpu-ub2048": ("glm-4.5-air@12", ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768",
                                               "-b", "2048", "-ub", "2048"], 4096),
    "gpt-oss-20b-gpu": ("gpt-oss-20b@12", ["-ngl", "999", "-c", "32768"], 2048),
}

_BUF = re.compile(r"(\w+[\w_]*)\s+(compute buffer|KV buffer|buffer|output buffer) size\s*=\s*([\d.]+) MiB")
_KV = re.compile(r"KV self size\s*=\s*([\d.]+) MiB")


class Sampler(threading.Thread):
    """The card's used memory every few milliseconds (NVML; nvidia-smi where NVML is missing)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.last = 0
        self.stop = False
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
        except Exception:
            def smi() -> int:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, check=True).stdout
                return int(out.split()[0]) << 20
            self.read = smi

    def run(self) -> None:
        while not self.stop:
            v = self.read()
            self.last = v
            self.peak = max(self.peak, v)
            time.sleep(0.002)


def post(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def buffers(log: str) -> dict[str, object]:
    out: dict[str, float] = {}
    for m in _BUF.finditer(log):
        out[f"{m.group(1)} {m.group(2)}"] = float(m.group(3))
    kv = _KV.search(log)
    return {"buffers_mib": out, "kv_self_mib": float(kv.group(1)) if kv else None}


def main() -> int:
    server, out, deadline = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    names = sys.argv[4:]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout

    (out / "logs").mkdir(parents=True, exist_ok=True)
    gg = Path(os.environ.get("GGUF_DIR", "/tmp/gguf"))
    gg.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, object]] = []
    idle_s = Sampler()
    idle = idle_s.read()
    port = 18080
    for name in names:
        layout, flags, n_prompt = CASES[name]
        rec: dict[str, object] = {"case": name, "layout": layout, "flags": flags, "prompt_tokens": n_prompt,
                                  "idle_used_mib": idle >> 20}
        results.append(rec)
        if time.time() + 75 > deadline:
            rec["skipped"] = "out of time"
            continue
        path = gg / f"{layout}.gguf"
        if not path.exists():
            t = time.time()
            base, _, blocks = layout.partition("@")
            lay = LAYOUTS[base]
            if blocks:
                lay = dataclasses.replace(lay, key=f"{base}-{blocks}", blocks=int(blocks))
            write_layout(lay, path)
            rec["write_s"] = round(time.time() - t, 1)
        port += 1
        logf = out / "logs" / f"{name}.log"
        s = Sampler()
        s.start()
        t0 = time.time()
        with open(logf, "w") as lf:
            p = subprocess.Popen([server, "-m", str(path), "--host", "127.0.0.1", "--port", str(port), *flags],
                                 stdout=lf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while not healthy(port):
                if p.poll() is not None or time.time() > min(deadline - 20, t0 + 300):
                    rec["error"] = f"server not up (exit {p.poll()})"
                    break
                time.sleep(0.5)
            else:
                rec["load_s"] = round(time.time() - t0, 1)
                time.sleep(1.0)
                rec["after_load_mib"] = s.last >> 20
                rec["peak_load_mib"] = s.peak >> 20
                prompt = [1000 + (i * 7919) % 20000 for i in range(n_prompt)]
                body = {"prompt": prompt, "n_predict": 32, "ignore_eos": True, "temperature": 0.0,
                        "cache_prompt": False}
                try:
                    wait = max(10.0, deadline - time.time() - 15)
                    r = post(f"http://127.0.0.1:{port}/completion", body, timeout=wait)
                    rec["timings"] = r.get("timings")
                except Exception as e:
                    rec["error"] = f"completion: {e}"
                time.sleep(0.5)
                rec["peak_mib"] = s.peak >> 20
        finally:
            s.stop = True
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        rec.update(buffers(logf.read_text(errors="replace")))
        (out / "results.json").write_text(json.dumps(results, indent=1))
        print(json.dumps(rec), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
