"""``python -m fedsbdt``: the ``fedsbdt`` command line (:mod:`fedsbdt.cli`)."""
import sys

from fedsbdt.cli import main

if __name__ == "__main__":
    sys.exit(main())
