"""`python -m memra` runs the command line."""

from memra.cli import app

app(prog_name="memra")
