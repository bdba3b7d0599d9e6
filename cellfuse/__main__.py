"""`python -m cellfuse` and the `cellfuse` command."""

# Ctrl+C while Python imports the command line would tear an import apart halfway (numpy then reports a
# broken install, with a traceback). So the first thing this module does is hold the interrupt, through
# _signal, which is built into the interpreter and so imported without touching the file system; the
# interrupt then ends the program as it does later, when a command runs: one line, exit 130.
import _signal

_held: list[int] = []
_previous = _signal.signal(_signal.SIGINT, lambda signum, frame: _held.append(signum))

import sys  # noqa: E402  (after the interrupt is held)


def main() -> int:
    try:
        from .cli import main as cli_main
    finally:
        _signal.signal(_signal.SIGINT, _previous)
    try:
        if _held:
            raise KeyboardInterrupt
        return cli_main()
    except KeyboardInterrupt:
        print("cellfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
