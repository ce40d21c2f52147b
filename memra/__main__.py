"""`python -m memra` runs the command line."""

from .cli import app

app(prog_name="memra")
