"""The ``panjoin`` command: its parser (one module per command registers its own
subcommand) and ``main``. Every subcommand takes ``--config FILE`` (TOML; keys are
the long option names, e.g. ``window = "count:1M,1M"`` or ``batch-size = 32768``);
flags given on the command line win over the file. Sizes accept K/M/G suffixes
(powers of two).

    panjoin gen events.parquet --n 2M --dist zipf
    panjoin replay events.parquet --window count:1M,1M --predicate band:10 \\
        --index bisort --out pairs.parquet
    panjoin bench index --index bisort --op probe --nsub 8M --partitions 64K --batch 32K
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from panjoin import __version__
from panjoin.cli.options import rpc_error
from panjoin.security import Security, use
from panjoin.semantics import SpecError

#: each command and the module that registers its subparser (``add_parser``), in the
#: order ``--help`` lists them: a command line that names one imports that module only
#: (the others' options, Kafka's and Spark's settings cost a replay's start 15 ms)
COMMANDS = {"replay": "panjoin.cli.replay", "gen": "panjoin.cli.gen",
            "bench": "panjoin.cli.bench", "cluster": "panjoin.cli.serve",
            "manager": "panjoin.cli.serve", "worker": "panjoin.cli.serve",
            "handshake-node": "panjoin.cli.serve", "status": "panjoin.cli.status",
            "demo": "panjoin.cli.demo", "ctl": "panjoin.cli.ctl", "kafka": "panjoin.kafka.cli",
            "pipeline": "spark_conn.cli"}


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The parser of every command, or of the one ``argv`` names."""
    ap = argparse.ArgumentParser(
        prog="panjoin",
        description="PanJoin: a sliding-window stream join with RaP-Table, WiB+-Tree and "
                    "BI-Sort subwindows.",
    )
    ap.add_argument("--version", action="version", version=f"panjoin {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    named = next((COMMANDS[a] for a in argv or () if a in COMMANDS), None)
    for module in [named] if named else dict.fromkeys(COMMANDS.values()):
        importlib.import_module(module).add_parser(sub)  # each sets its subparsers' ``run``
    return ap


def _chosen_parser(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of the command named in argv (``bench index`` included)."""
    parser = ap
    for tok in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if tok in subs[0].choices:
            parser = subs[0].choices[tok]
    return parser


def parse(argv) -> argparse.Namespace:
    """Parse flags; a ``--config`` TOML file supplies defaults that flags override."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    ap = build_parser(sys.argv[1:] if argv is None else list(argv))
    if known.config:
        import tomllib
        from pathlib import Path

        path = Path(known.config)
        try:
            conf = tomllib.loads(path.read_text())
        except FileNotFoundError:
            ap.error(f"config file {path} not found")
        except tomllib.TOMLDecodeError as e:
            ap.error(f"config file {path} is not valid TOML: {e}")
        argv = sys.argv[1:] if argv is None else list(argv)
        sub = _chosen_parser(ap, argv)
        actions = {a.dest: a for a in sub._actions}
        defaults = {}
        for k, v in conf.items():
            action = actions.get(k.replace("-", "_"))
            if action is None or action.dest in ("help", "config"):
                continue
            if action.type is not None and isinstance(v, str):
                v = action.type(v)
            defaults[action.dest] = v
            action.required = False
        sub.set_defaults(**defaults)
        unknown = sorted(k for k in conf if k.replace("-", "_") not in defaults)
        if unknown:
            ap.error(f"config file {path}: unknown option(s) {', '.join(unknown)}")
    return ap.parse_args(argv)


def main(argv=None, before_run=None) -> int:
    """Parse ``argv`` and run its command; ``before_run`` (the process's entry, see
    :mod:`panjoin.cli.process`) is called once the command's modules are loaded."""
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from panjoin.ops.profiling import install

    install(args.cmd)  # only with $PANJOIN_PROFILE (a debugging aid)
    if before_run is not None:
        before_run()
    try:
        use(Security.from_args(args))  # every channel and server follows the flags
        return args.run(args)
    except (SpecError, ValueError, TypeError, FileNotFoundError) as e:
        from panjoin.events import EventError

        kind = "bad input" if isinstance(e, EventError) else "error"
        print(f"panjoin {args.cmd}: {kind}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as e:
        line = rpc_error(e)  # a manager's or worker's answer: the user acts on its code
        if line is None:
            raise
        print(f"panjoin {args.cmd}: {line}", file=sys.stderr)
        return 1
