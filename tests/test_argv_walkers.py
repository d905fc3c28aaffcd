"""Readers of an engine command line that walked it with their own loops and read it otherwise
than the engine does, each moved onto the one argv reader (engines/cmdline.py read_argv). Every
test here fails on the code before the move."""

from __future__ import annotations

from moeconf.engines import engine

MAIN = engine("llama.cpp")
IK = engine("ik_llama.cpp")


def test_memory_settings_read_the_line_as_the_engine_does() -> None:
    """read_settings walked its own loop: `--ctx_size` (the engines read `_` as `-`) went unread,
    and a value that reads as a flag (`--alias -c`) was taken for one."""
    from moeconf.memory import read_settings

    assert read_settings(["llama-server", "--ctx_size", "8192", "--batch_size", "1024"], MAIN).n_ctx == 8192
    assert read_settings(["llama-server", "--ctx_size", "8192", "--batch_size", "1024"], MAIN).n_batch == 1024
    s = read_settings(["llama-server", "-a", "-c", "-ub", "256"], MAIN)
    assert (s.n_ctx, s.n_ubatch, s.problems) == (0, 256, ())
    # ik_llama.cpp's own flags on ik, and --name=value read as meant, are unchanged
    assert read_settings(["-mla", "3", "--ctx-size=4096"], IK).mla == 3
    assert read_settings(["-mla", "3", "--ctx-size=4096"], IK).n_ctx == 4096


def test_flags_extra_is_read_as_the_engine_reads_it() -> None:
    """scan_extra walked `[flags] extra` itself: a two-value flag's second value was an unknown
    word, and a flag the declared build still has (`-dio` before b11312) was unknown."""
    from moeconf.engines.flags import scan_extra

    assert scan_extra(["--control-vector-layer-range", "1", "4", "-t", "8"], MAIN) == ([(3, "-t")], [])
    assert scan_extra(["-dio", "--jinja"], engine("llama.cpp", "b11000")) == ([], [])
    assert scan_extra(["-dio"], MAIN) == ([], [(0, "-dio")])
    # an unknown option's value, and a stray word, as before
    assert scan_extra(["--frobnicate", "3", "--jinja", "stray"], MAIN) == ([], [(0, "--frobnicate"), (3, "stray")])
