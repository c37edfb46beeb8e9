"""The subcommands of ``gemmlab``, one module each, in the order ``gemmlab --help`` lists them.
Each module has ``add_parser(subparsers)``, which registers its parser with ``func`` set to
its runner, ``func(args, console) -> int`` (the exit status).
A new subcommand is one module added here."""

from . import bench, comm, generate, info, profile, scale, study, tp, train, tune

COMMANDS = (bench, tune, comm, tp, train, generate, scale, study, profile, info)
