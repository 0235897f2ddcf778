"""Machinery every family shares; never op logic."""
