"""The architecture registry (moeconf/memory/graph/archs) imports a composition module when its
architecture is asked for: `fit` of one model imports that model's composition only, and listing
the registry imports them all, in module order, as the eager registry did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import moeconf.memory.graph.archs as archs
from tests.conftest import EXAMPLES, REPO

ARCHS_DIR = Path(archs.__file__).parent
PREFIX = "moeconf.memory.graph.archs."


def _composition_modules() -> list[str]:
    return sorted(p.stem for p in ARCHS_DIR.glob("*.py") if not p.stem.startswith("_") and p.stem != "common")


def _run(code: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout.splitlines()[-1]))


_LOADED = ("sorted(m[len('" + PREFIX + "'):] for m in sys.modules if m.startswith('" + PREFIX + "') "
           "and not m.rsplit('.', 1)[1].startswith('_') and not m.endswith('.common'))")


def test_fit_imports_only_the_models_composition() -> None:
    manifest = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"
    got = _run(
        "import contextlib, io, json, runpy, sys\n"
        f"sys.argv = ['moeconf', 'fit', {str(manifest)!r}, '--gpu', '12GiB', '--', '-c', '8192']\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        "        runpy.run_module('moeconf', run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        code = e.code\n"
        f"print(json.dumps({{'code': code, 'loaded': {_LOADED}}}))\n")
    assert got == {"code": 0, "loaded": ["qwen3moe"]}


def test_asking_imports_one_and_listing_imports_all_in_module_order() -> None:
    got = _run(
        "import json, sys\n"
        "import moeconf.memory.graph.archs as a\n"
        "import moeconf.memory.support as s\n"
        "one = [a.traits('glm-dsa').indexer, 'grok' in a.ARCHS, a.traits('no-such-arch') == a.Traits(), "
        "'glm_dsa' in a.COMPOSITIONS, 'common' in a.COMPOSITIONS, '_dsa' in a.ARCHS, 'qwen3moe' in s.MODELLED]\n"
        f"asked = {_LOADED}\n"
        "names = list(a.COMPOSITIONS)\n"
        "mods = [a.COMPOSITIONS[n].module.rsplit('.', 1)[1] for n in names]\n"
        "n_modelled = len(s.MODELLED)\n"
        f"print(json.dumps({{'one': one, 'asked': asked, 'mods': mods, 'all': {_LOADED}, 'modelled': n_modelled, "
        "'archs': list(a.ARCHS) == names}))\n")
    assert got["one"] == ["full", True, True, False, False, False, True]
    assert got["asked"] == ["glm_dsa", "grok", "qwen3moe"]
    assert got["mods"] == got["all"] == _composition_modules()
    assert got["archs"] is True
    assert isinstance(got["modelled"], int) and got["modelled"] >= len(_composition_modules()) // 2


def test_the_lazy_mapping_keeps_what_is_set_and_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def one(key: str) -> int:
        calls.append(key)
        if key not in ("a", "b", "c"):
            raise KeyError(key)
        return ord(key)

    lazy = archs.Lazy(one, lambda: ["c", "a", "b", "a"])
    assert lazy["b"] == 98 and calls == ["b"]
    assert "z" not in lazy and lazy.get("z") is None
    lazy["x"] = 1
    del lazy["a"]
    with pytest.raises(KeyError):
        lazy["a"]  # deleted stays deleted: not computed again
    assert list(lazy) == ["c", "b", "x"] and len(lazy) == 3
    assert dict(lazy.items()) == {"c": 99, "b": 98, "x": 1}
    lazy["a"] = 5  # set again after its deletion: last, as in a dict
    assert list(lazy) == ["c", "b", "x", "a"] and lazy["a"] == 5
    with pytest.raises(KeyError):
        lazy["q"]  # listed: nothing more is computed
    assert calls.count("q") == 0


def test_a_module_not_named_after_its_arch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.memory.graph.archs.grok as grok

    monkeypatch.setattr(grok, "ARCH", "grok-2", raising=False)
    with pytest.raises(AssertionError, match="named after its ARCH"):
        archs._load("grok")
