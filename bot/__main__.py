"""`python -m bot` runs the runbot command line."""

from bot.cli import main

raise SystemExit(main())
