"""The command each container or proxy target runs, as words (one word a value): the `docker
run` line and its image, the server arguments a container gets, and the llama-swap `cmd`.
`moeconf.emitting.targets` renders them as text; `moeconf.emitting.readback` compares what it
reads back with them, so both import this module and neither imports the other back."""

from __future__ import annotations

from moeconf.compiled import Compiled
from moeconf.emitting.argv import build_argv
from moeconf.errors import MoeconfError

MAINLINE_IMAGE = "ghcr.io/ggml-org/llama.cpp"
IK_IMAGE = "ghcr.io/ikawrakow/ik-llama-cpp"
_MAINLINE_TAGS = {"cpu": "server", "cuda": "server-cuda", "cuda13": "server-cuda13", "rocm": "server-rocm",
                  "vulkan": "server-vulkan", "intel": "server-intel", "musa": "server-musa"}
_IK_TAGS = {"cpu": "cpu-server", "cuda": "cu12-server", "cuda13": "cu13-server"}
_DOCKER_DEVICES = {"cuda": ["--gpus", "all"], "cuda13": ["--gpus", "all"], "rocm": ["--device", "/dev/kfd", "--device",
                   "/dev/dri"], "vulkan": ["--device", "/dev/dri"], "intel": ["--device", "/dev/dri"],
                   "musa": ["--device", "/dev/mtgpu"], "cpu": []}
DEFAULT_PORT = 8080


def docker_image(c: Compiled) -> str:
    t = c.plan.config.targets
    if t.docker_image:
        return str(t.docker_image)
    backend = t.docker_backend
    if c.engine.name == "llama.cpp":
        tag = _MAINLINE_TAGS[backend]
        if c.engine.version and c.engine.build is not None and c.engine.version.lstrip("b").isdigit():
            tag += f"-b{c.engine.build}"
        return f"{MAINLINE_IMAGE}:{tag}"
    if backend not in _IK_TAGS:
        raise MoeconfError(
            f"ik_llama.cpp publishes no {backend!r} image (it has {', '.join(_IK_TAGS)})",
            path=c.plan.path, hint="set [targets] docker_image to your own image",
        )
    return f"{IK_IMAGE}:{_IK_TAGS[backend]}"


def server_args(c: Compiled, *, for_container: bool) -> list[str]:
    """Server arguments without the binary (container images start the server themselves)."""
    args = build_argv(c.plan, c.engine, c.inventory, c.synthesis, model_path=_model_override(c),
                      with_binary=False)
    t = c.plan.config.targets
    if for_container and not t.host and extra_value(c, "--host") is None:
        # mainline images set LLAMA_ARG_HOST=0.0.0.0; ik's do not: listen on all interfaces
        args += ["--host", "0.0.0.0"]
    if for_container and t.port is None and extra_value(c, "--port") is None:
        args += ["--port", str(DEFAULT_PORT)]
    return args


def extra_value(c: Compiled, option: str) -> str | None:
    """The value `[flags] extra` gives `option` (`--host`, `--port`, any spelling), as the engine
    reads it (engines/argvread.py read_argv; the last one wins), or None."""
    from moeconf.engines.argvread import read_argv

    given = read_argv(list(c.plan.config.flags.extra), c.engine, binary=False).of(option)
    return next((o.value.text for o in reversed(given) if o.value is not None), None)


def published_port(c: Compiled) -> int | str:
    """The port the server listens on: `[targets] port`, else `--port` in `[flags] extra`, else 8080."""
    t = c.plan.config.targets
    return t.port or extra_value(c, "--port") or DEFAULT_PORT


def _model_override(c: Compiled) -> str | None:
    """The compiled `-m` value; None when there is none (a manifest without serve_path,
    compiled for the bare `-ot` output)."""
    from moeconf.engines.argvread import read_argv

    given = read_argv(c.argv, c.engine).last("-m")
    return given.value.text if given is not None and given.value is not None else None


def docker_argv(c: Compiled) -> list[str]:
    """The `docker run` command line, one word a value (quoted by `emit_docker`)."""
    t = c.plan.config.targets
    port = published_port(c)
    argv = ["docker", "run", "--rm", *_DOCKER_DEVICES[t.docker_backend], "-p", f"{port}:{port}"]
    for v in t.docker_volumes:
        argv += ["-v", v]
    argv.append(docker_image(c))
    argv += server_args(c, for_container=True)
    return argv


def llama_swap_argv(c: Compiled) -> list[str]:
    """The command the llama-swap entry runs; llama-swap fills `${PORT}` when no port is set."""
    unset = c.plan.config.targets.port is None and extra_value(c, "--port") is None
    return list(c.argv) + (["--port", "${PORT}"] if unset else [])
