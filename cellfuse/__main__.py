"""`python -m cellfuse` and the `cellfuse` command."""

import sys


def main() -> int:
    # Ctrl+C while Python is still importing the command line or building its parser ends as it does
    # later, when the command runs: one line, exit 130.
    try:
        from .cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        print("cellfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
