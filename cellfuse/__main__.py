"""`python -m cellfuse` and the `cellfuse` command."""

import signal
import sys


def main() -> int:
    # Ctrl+C while Python imports the command line would tear a C extension's import apart halfway
    # (numpy then reports a broken install, with a traceback). The interrupt is held until the imports
    # are done, then ends the program as it does later, when a command runs: one line, exit 130.
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        from .cli import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        if held:
            raise KeyboardInterrupt
        return cli_main()
    except KeyboardInterrupt:
        print("cellfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
