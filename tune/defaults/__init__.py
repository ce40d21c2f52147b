"""Frozen per-device default tables (package data memra.defaults in the wheel); see README.md."""
