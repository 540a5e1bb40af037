"""runbot: what are my training runs doing? One line each (the version lives here, once)."""

__version__ = "0.1.0"
