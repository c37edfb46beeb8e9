"""The subcommands of ``gemmlab``, one module each, in the order ``gemmlab --help`` lists them.
Each module has ``add_parser(subparsers)``, which registers its parser with ``func`` set to
its runner, ``func(args, console) -> int`` (the exit status).
A new subcommand is one module added here."""

from . import bench, comm, info, profile, scale, tp, train, tune

COMMANDS = (bench, tune, comm, tp, train, scale, profile, info)
