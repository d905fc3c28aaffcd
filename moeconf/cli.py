"""The `moeconf` command: argument parsing only. Each subcommand imports what it needs when it
runs, so `moeconf --help` and a pre-commit hook start in milliseconds."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from moeconf.errors import MoeconfError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moeconf",
        description="Declarative, checked tensor placement for MoE models on llama.cpp and ik_llama.cpp.",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ins = sub.add_parser(
        "inspect",
        help="show a model's tensor inventory (GGUF, any shard, or a manifest)",
        description="Read a model's GGUF header (every shard of a split model) or a moeconf "
        "manifest and show its layers and tensor groups.",
    )
    ins.add_argument("model", help="a .gguf file (first or any shard) or a manifest .json")
    fmt = ins.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the full inventory as JSON")
    fmt.add_argument(
        "--manifest", action="store_true",
        help="write a manifest (a small JSON snapshot other commands accept in place of the GGUF)",
    )
    ins.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    ins.add_argument("--tensors", action="store_true", help="also list every tensor in the text summary")
    ins.add_argument("--color", choices=["auto", "always", "never"], default="auto", help=argparse.SUPPRESS)
    return p


def _write_output(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    from moeconf.atomic import write_text_atomic

    try:
        write_text_atomic(output, text)
    except OSError as e:
        raise MoeconfError(f"cannot write: {e.strerror or e}", path=output) from None


def _cmd_inspect(args: argparse.Namespace) -> int:
    from moeconf.model.inventory import load_inventory

    inv = load_inventory(args.model)
    if args.manifest:
        from moeconf.model.manifest import dumps_manifest

        _write_output(dumps_manifest(inv), args.output)
    elif args.json:
        import json

        from moeconf.report.inventory import inventory_json

        _write_output(json.dumps(inventory_json(inv), indent=1) + "\n", args.output)
    else:
        from moeconf.report.inventory import render_summary

        _write_output(render_summary(inv, list_tensors=args.tensors), args.output)
    for w in inv.warnings:
        print(f"moeconf: warning: {inv.source}: {w}", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from moeconf import __version__

        print(f"moeconf {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handlers = {"inspect": _cmd_inspect}
    try:
        return handlers[args.command](args)
    except MoeconfError as e:
        print(f"moeconf: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("moeconf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error. Silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
