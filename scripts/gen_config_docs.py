"""Write docs/configuration.md from ``toolrail.settings.Settings`` (same as ``toolrail config docs``)."""

import sys

from toolrail.cli import main

if __name__ == "__main__":
    sys.exit(main(["config", "docs", *sys.argv[1:]]))
