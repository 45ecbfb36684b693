"""`python -m simulator.launch_server <SGLang args>`: the GPU-free SGLang stand-in."""

from __future__ import annotations

import sys

from simulator.cli import parse_server_args


def main(argv: list[str] | None = None) -> None:
    """Parse SGLang's arguments (exit 2 on bad ones, like argparse) and run the simulated server."""
    args = parse_server_args(sys.argv[1:] if argv is None else argv)
    from simulator.lifecycle import run

    run(args)


if __name__ == "__main__":
    main()
