"""Allow `python -m guardctl`."""

from guardctl.cli import main

main()
