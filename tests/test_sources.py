"""Launch-file extraction: every format gives the engine argv with exact file positions."""

from __future__ import annotations

from pathlib import Path

from moeconf.engines.argvread import Arg
from moeconf.linting.sources import read_source


def find(args: list[Arg], text: str) -> Arg:
    return next(a for a in args if a.text == text)


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_shell_continuations_variables_and_positions(tmp_path: Path) -> None:
    path = write(tmp_path, "run.sh", (
        "#!/bin/sh\n"
        "OT='exps=CPU'\n"
        "OPTS=\"-ngl 999 -c 4096\"\n"
        "CUDA_VISIBLE_DEVICES=0 LLAMA_ARG_FIT=off ./llama-server -m /m.gguf $OPTS \\\n"
        "   -ot \"blk\\.3\\.=CUDA0,$OT\"\n"
    ))
    src = read_source(path)
    assert src is not None
    (launch,) = src.launches
    texts = [a.text for a in launch.args]
    assert texts == ["./llama-server", "-m", "/m.gguf", "-ngl", "999", "-c", "4096", "-ot", r"blk\.3\.=CUDA0,exps=CPU"]
    assert launch.env["LLAMA_ARG_FIT"].text == "off"
    ot = launch.args[-1]
    assert (ot.line, ot.column) == (5, 9)
    # inside "..." a backslash before '.' stays, so the file has the same characters as the value
    assert ot.at(len(r"blk\.3")) == (5, 9 + len(r"blk\.3"))
    assert ot.at(len(r"blk\.3\.=CUDA0,")) == (5, 9 + len(r"blk\.3\.=CUDA0,"))  # expanded $OT: at the '$'


def test_shell_docker_run(tmp_path: Path) -> None:
    path = write(tmp_path, "d.sh", "docker run --gpus all -e LLAMA_ARG_N_GPU_LAYERS=999 "
                 "ghcr.io/ggml-org/llama.cpp:server-cuda-b7600 -m /m.gguf -ot exps=CPU\n")
    src = read_source(path)
    assert src is not None
    (launch,) = src.launches
    assert launch.image == "ghcr.io/ggml-org/llama.cpp:server-cuda-b7600"
    assert not launch.has_binary
    assert [a.text for a in launch.args] == ["-m", "/m.gguf", "-ot", "exps=CPU"]
    assert launch.env["LLAMA_ARG_N_GPU_LAYERS"].text == "999"


def test_compose_string_and_list_commands(tmp_path: Path) -> None:
    path = write(tmp_path, "compose.yaml", (
        "services:\n"
        "  a:\n"
        "    image: ghcr.io/ggml-org/llama.cpp:server-cuda\n"
        "    command: -m /m.gguf -ot 'exps=CPU' -ot blk\\.1=CUDA0$$\n"
        "    environment:\n"
        "      - LLAMA_ARG_OVERRIDE_TENSOR=attn=CPU\n"
        "  b:\n"
        "    image: ghcr.io/ikawrakow/ik-llama-cpp:cu12-server\n"
        "    command: [\"-m\", \"/m.gguf\", \"-ot\", 'exps=CPU']\n"
        "    environment:\n"
        "      LLAMA_ARG_CTX_SIZE: \"4096\"\n"
        "  db:\n"
        "    image: postgres\n"
    ))
    src = read_source(path)
    assert src is not None
    a, b = src.launches
    assert [x.text for x in a.args] == ["-m", "/m.gguf", "-ot", "exps=CPU", "-ot", "blk.1=CUDA0$"]
    assert (find(a.args, "exps=CPU").line, find(a.args, "exps=CPU").column) == (4, 30)
    assert a.env["LLAMA_ARG_OVERRIDE_TENSOR"].text == "attn=CPU"
    assert (a.env["LLAMA_ARG_OVERRIDE_TENSOR"].line, a.env["LLAMA_ARG_OVERRIDE_TENSOR"].column) == (6, 35)
    assert [x.text for x in b.args] == ["-m", "/m.gguf", "-ot", "exps=CPU"]
    assert (b.args[3].line, b.args[3].column) == (9, 40)


def test_llama_swap_macros_comments_and_folding(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", (
        "macros:\n"
        "  bin: /opt/llama-server --port ${PORT}\n"
        "models:\n"
        "  m1:\n"
        "    cmd: |\n"
        "      ${bin} -m /m.gguf \\\n"
        "      # a comment line\n"
        "      -ot 'exps=CPU'\n"
        "  m2:\n"
        "    cmd: ${bin} -m /x.gguf -ngl 10\n"
    ))
    src = read_source(path)
    assert src is not None
    m1, m2 = src.launches
    assert [a.text for a in m1.args] == ["/opt/llama-server", "--port", "8080", "-m", "/m.gguf", "-ot", "exps=CPU"]
    ot = find(m1.args, "exps=CPU")
    assert (ot.line, ot.column) == (8, 12)
    ngl = find(m2.args, "-ngl")
    assert ngl.line == 10 and ngl.column == len("    cmd: ${bin} -m /x.gguf ") + 1


def test_dotenv_and_systemd(tmp_path: Path) -> None:
    env = write(tmp_path, "server.env", "# c\nexport LLAMA_ARG_OVERRIDE_TENSOR='exps=CPU'\nOTHER=1\n")
    src = read_source(env)
    assert src is not None
    (launch,) = src.launches
    v = launch.env["LLAMA_ARG_OVERRIDE_TENSOR"]
    assert (v.text, v.line, v.column) == ("exps=CPU", 2, 35)
    unit = write(tmp_path, "llama.service", (
        "[Service]\n"
        "Environment=\"LLAMA_ARG_CTX_SIZE=4096\" LLAMA_ARG_FIT=off\n"
        "ExecStart=-/opt/llama-server -m /m.gguf \\\n"
        "  -ot exps=CPU\n"
    ))
    src = read_source(unit)
    assert src is not None
    (launch,) = src.launches
    assert [a.text for a in launch.args] == ["/opt/llama-server", "-m", "/m.gguf", "-ot", "exps=CPU"]
    assert (launch.args[-1].line, launch.args[-1].column) == (4, 7)
    assert launch.env["LLAMA_ARG_FIT"].text == "off"


def test_not_a_launch_file(tmp_path: Path) -> None:
    assert read_source(write(tmp_path, "notes.txt", "llama-server -ot x")) is None
    src = read_source(write(tmp_path, "other.sh", "echo hello\nls -la\n"))
    assert src is not None and src.launches == []
