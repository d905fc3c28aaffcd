"""Print the architectures whose loader (pinned llama.cpp, src/models/<arch>.cpp load_arch_tensors)
creates the output from `token_embd` a second time (TENSOR_DUPLICATED) when the file has no
`output.weight`: the data behind moeconf/engines/tied.py. Usage: python scripts/gen-tied-output.py SRC
(SRC: the engine's source root, e.g. ~/.cache/moeconf/engines/llama-cpp-python-0.3.36/src/vendor/llama.cpp)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def main(root: Path) -> list[str]:
    src = root / "src"
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', (src / "llama-arch.cpp").read_text()))
    cls: dict[str, str] = {}
    for m in re.finditer(r"((?:case LLM_ARCH_\w+:\s*)+)return new (llama_model_\w+)\(",
                         (src / "llama-model.cpp").read_text()):
        for a in re.findall(r"LLM_ARCH_\w+", m.group(1)):
            cls[a] = m.group(2)
    header = (src / "models" / "models.h").read_text()
    parent = dict(re.findall(r"struct (llama_model_\w+) : public (llama_model_\w+)", header))
    tied: set[str] = set()
    for f in (src / "models").glob("*.cpp"):
        text = f.read_text()
        if re.search(r'LLM_TENSOR_TOKEN_EMBD, *"weight"\)[^;]*TENSOR_DUPLICATED', text):
            tied.update(re.findall(r"(llama_model_\w+)::load_arch_tensors", text))

    def ties(c: str | None) -> bool:
        while c is not None:
            if c in tied:
                return True
            c = parent.get(c)
        return False

    return sorted(names[a] for a, c in cls.items() if a in names and ties(c))


if __name__ == "__main__":
    print(main(Path(sys.argv[1]).expanduser()))
